"""Small data sets written in the exact on-disk formats of the real ones.

Pixels are seeded by the image's position, so a test can check that an image came through
the pipeline unchanged.
"""

from __future__ import annotations

import io
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path

import numpy as np


def pixels(seed: int, n: int, shape=(32, 32, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


def balanced_labels(n_classes: int, per_class: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(n_classes), per_class))


def _chw_rows(images_hwc: np.ndarray) -> np.ndarray:
    return images_hwc.transpose(0, 3, 1, 2).reshape(len(images_hwc), -1)


class _Py2Pickler(pickle._Pickler):
    """Pickles as Python 2 wrote the real CIFAR files: its str (bytes here) as STRING opcodes, which
    Python 3 loads as bytes under encoding="bytes" and as str under "latin1" (and refuses under
    "ASCII" where a byte is over 127). Python 3's own protocol 2 writes bytes as `_codecs.encode`
    calls, which load as bytes under any encoding: a reader's wrong encoding would go unnoticed."""
    dispatch = pickle._Pickler.dispatch.copy()

    def save_bytes(self, obj: bytes) -> None:
        n = len(obj)
        self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj if n < 256
                   else pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_bytes


def py2_pickle(obj) -> bytes:
    f = io.BytesIO()
    _Py2Pickler(f, protocol=2).dump(obj)
    return f.getvalue()


def _batch(images, labels, label_key: bytes, name: bytes, prefix: str) -> bytes:
    d = {b"batch_label": name, label_key: [int(x) for x in labels], b"data": _chw_rows(images),
         b"filenames": [f"{prefix}_{i:05d}.png".encode() for i in range(len(labels))]}
    if label_key == b"fine_labels":
        d[b"coarse_labels"] = [int(x) // 5 for x in labels]
    return py2_pickle(d)


def cifar_arrays(n_classes: int, train_per_class: int, test_per_class: int):
    ytr = balanced_labels(n_classes, train_per_class, 1)
    yte = balanced_labels(n_classes, test_per_class, 2)
    return pixels(11, len(ytr)), ytr, pixels(12, len(yte)), yte


def cifar_members(n_classes: int, train_per_class: int, test_per_class: int) -> dict[str, bytes]:
    xtr, ytr, xte, yte = cifar_arrays(n_classes, train_per_class, test_per_class)
    if n_classes == 10:
        out = {}
        for k, (xs, ys) in enumerate(zip(np.array_split(xtr, 5), np.array_split(ytr, 5)), start=1):
            out[f"data_batch_{k}"] = _batch(xs, ys, b"labels", f"training batch {k} of 5".encode(), "train")
        out["test_batch"] = _batch(xte, yte, b"labels", b"testing batch 1 of 1", "test")
        out["batches.meta"] = py2_pickle({b"label_names": [f"class{c}".encode() for c in range(10)],
                                          b"num_cases_per_batch": len(ytr) // 5, b"num_vis": 3072})
    else:
        out = {"train": _batch(xtr, ytr, b"fine_labels", b"training batch 1 of 1", "train"),
               "test": _batch(xte, yte, b"fine_labels", b"testing batch 1 of 1", "test"),
               "meta": py2_pickle({b"fine_label_names": [f"fine{c}".encode() for c in range(n_classes)],
                                   b"coarse_label_names": [f"coarse{c}".encode() for c in range(20)]})}
    return out


def write_cifar(root: Path, n_classes: int = 10, train_per_class: int = 40, test_per_class: int = 6,
                form: str = "archive", members: dict[str, bytes] | None = None, order=None,
                mode: str = "w:gz") -> Path:
    """Write cifar-10-python.tar.gz / cifar-100-python.tar.gz (form="archive") or the extracted folder."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    folder = "cifar-10-batches-py" if n_classes == 10 else "cifar-100-python"
    archive = "cifar-10-python.tar.gz" if n_classes == 10 else "cifar-100-python.tar.gz"
    members = members if members is not None else cifar_members(n_classes, train_per_class, test_per_class)
    names = order or sorted(members)
    if form == "folder":
        (root / folder).mkdir(exist_ok=True)
        for n in names:
            (root / folder / n).write_bytes(members[n])
        return root / folder
    with tarfile.open(root / archive, mode) as tar:
        for n in names:
            info = tarfile.TarInfo(f"{folder}/{n}")
            info.size = len(members[n])
            tar.addfile(info, io.BytesIO(members[n]))
    return root / archive


def smooth_pixels(seed: int, n: int, size: int = 64) -> np.ndarray:
    """Low-frequency images, which survive JPEG nearly unchanged."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, size)[None, :, None, None] * rng.uniform(-80, 80, (n, 1, 1, 3))
    base = rng.uniform(60, 190, (n, 1, 1, 3))
    return np.clip(base + ramp + np.zeros((1, 1, size, 1)), 0, 255).astype(np.uint8)


GREY = 50


def _jpeg(img: np.ndarray, grey: bool = False) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    im = Image.fromarray(img)
    (im.convert("L") if grey else im).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def tiny_wnids(n_classes: int = 200) -> list[str]:
    """The fake's wnids.txt, line c (class c) first to last."""
    return sorted((f"n{10000000 + 7 * c:08d}" for c in range(n_classes)), reverse=True)


def write_tinyimagenet(root: Path, train_per_class: int = 3, val_per_class: int = 1, form: str = "folder",
                       n_classes: int = 200) -> Path:
    """tiny-imagenet-200/ (or its .zip) with wnids.txt, words.txt, train/<wnid>/images, val/.

    As in the real set: wnids.txt is not sorted (here: descending, so class c, the c-th line, is the
    c-th wnid from the end), words.txt lists more ids than the set uses, a few images are greyscale
    JPEGs (every GREY-th of the training images), and the zip holds entries for its folders."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    wnids = tiny_wnids(n_classes)
    files: dict[str, bytes] = {
        "wnids.txt": "\n".join(wnids).encode() + b"\n",
        "words.txt": "".join(f"{w}\tthing {c}, other name\n" for c, w in enumerate(wnids)).encode()
        + b"n00000001\tunused id, not in wnids.txt\n",
    }
    imgs = smooth_pixels(21, n_classes * train_per_class)
    for c, w in enumerate(wnids):
        boxes = []
        for i in range(train_per_class):
            k = c * train_per_class + i
            files[f"train/{w}/images/{w}_{i}.JPEG"] = _jpeg(imgs[k], grey=k % GREY == GREY - 1)
            boxes.append(f"{w}_{i}.JPEG\t0\t0\t63\t63")
        files[f"train/{w}/{w}_boxes.txt"] = ("\n".join(boxes) + "\n").encode()
    ann = []
    vimgs = smooth_pixels(22, n_classes * val_per_class)
    for k in range(n_classes * val_per_class):
        files[f"val/images/val_{k}.JPEG"] = _jpeg(vimgs[k])
        ann.append(f"val_{k}.JPEG\t{wnids[k % n_classes]}\t0\t0\t63\t63")
    files["val/val_annotations.txt"] = ("\n".join(ann) + "\n").encode()
    files["test/images/test_0.JPEG"] = _jpeg(vimgs[0])
    if form == "zip":
        path = root / "tiny-imagenet-200.zip"
        with zipfile.ZipFile(path, "w") as z:
            folders = set()
            for rel in files:
                parts = f"tiny-imagenet-200/{rel}".split("/")[:-1]
                folders |= {"/".join(parts[:i]) + "/" for i in range(1, len(parts) + 1)}
            for d in sorted(folders):
                z.writestr(d, b"")
            for rel, b in files.items():
                z.writestr(f"tiny-imagenet-200/{rel}", b)
        return path
    for rel, b in files.items():
        p = root / "tiny-imagenet-200" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b)
    return root / "tiny-imagenet-200"
