"""Readers for the raw datasets in their standard on-disk formats.

Content is validated (members, keys, shapes, label ranges), never file MD5s: a repacked
archive of the same images must load. Images come out as uint8 [N, H, W, 3].
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
import zlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pbr.errors import DataError

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
TINYIMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"


@dataclass
class RawDataset:
    name: str
    train_images: np.ndarray  # uint8 [N, H, W, 3]
    train_labels: np.ndarray  # int64 [N]
    test_images: np.ndarray
    test_labels: np.ndarray
    class_names: list[str]
    source: str  # the file or folder it was read from

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])

    def content_hash(self) -> str:
        """sha256 of pixels and labels: identifies the data whatever archive carried it."""
        h = hashlib.sha256()
        for a in (self.train_images, self.train_labels, self.test_images, self.test_labels):
            h.update(np.ascontiguousarray(a).data)
        h.update("\n".join(self.class_names).encode())
        return h.hexdigest()


@dataclass(frozen=True)
class _CifarLayout:
    title: str
    archive: str
    folder: str
    train_members: tuple[str, ...]
    test_member: str
    meta_member: str
    label_key: bytes
    names_key: bytes
    n_classes: int
    url: str


CIFAR10 = _CifarLayout(
    "CIFAR-10", "cifar-10-python.tar.gz", "cifar-10-batches-py",
    tuple(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta",
    b"labels", b"label_names", 10, CIFAR10_URL,
)
CIFAR100 = _CifarLayout(
    "CIFAR-100", "cifar-100-python.tar.gz", "cifar-100-python",
    ("train",), "test", "meta", b"fine_labels", b"fine_label_names", 100, CIFAR100_URL,
)


def _unpickle(blob: bytes, where: str) -> dict:
    try:
        obj = pickle.loads(blob, encoding="bytes")
    except Exception as e:  # a truncated or foreign pickle raises many kinds of errors
        raise DataError(f"{where}: not a readable CIFAR pickle ({type(e).__name__}); replace the file") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a dict in the CIFAR pickle, found {type(obj).__name__}")
    return obj


def _cifar_members(layout: _CifarLayout, path: Path) -> dict[str, bytes]:
    """The raw bytes of every needed member, from the archive or the extracted folder."""
    wanted = set(layout.train_members) | {layout.test_member, layout.meta_member}
    found: dict[str, bytes] = {}
    if path.is_dir():
        for name in wanted:
            f = path / name
            if f.is_file():
                found[name] = f.read_bytes()
    else:
        try:
            # Stream once through the archive: members may come in any order, under any prefix.
            with tarfile.open(path, "r:*") as tar:
                for m in tar:
                    base = m.name.rsplit("/", 1)[-1]
                    if m.isfile() and base in wanted and base not in found:
                        found[base] = tar.extractfile(m).read()
                # To the end: gzip checks its CRC only there, and a flipped bit in a member would load.
                while tar.fileobj.read(1 << 20):
                    pass
        except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
            raise DataError(
                f"{path}: not a readable {layout.title} archive ({type(e).__name__}: {(str(e).splitlines() or [''])[0]}); "
                f"the file is truncated or corrupt, replace it"
            ) from None
    missing = sorted(wanted - set(found))
    if missing:
        raise DataError(f"{path}: {layout.title} member(s) missing: {', '.join(missing)}; replace the data")
    return found


def _cifar_batch(d: dict, layout: _CifarLayout, where: str) -> tuple[np.ndarray, np.ndarray]:
    for key in (b"data", layout.label_key):
        if key not in d:
            raise DataError(f"{where}: key {key!r} missing from the {layout.title} batch")
    data = np.asarray(d[b"data"])
    labels = np.asarray(d[layout.label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"{where}: 'data' must be uint8 rows of 3072 values, found {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise DataError(f"{where}: {data.shape[0]} images but {labels.shape[0]} labels")
    if labels.size and (labels.min() < 0 or labels.max() >= layout.n_classes):
        raise DataError(f"{where}: labels outside 0..{layout.n_classes - 1}")
    # CIFAR rows are channel planes (R, G, B); the project stores HWC.
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), labels


def read_cifar(layout: _CifarLayout, path: Path, name: str) -> RawDataset:
    members = _cifar_members(layout, path)
    where = lambda m: f"{path}:{m}"  # noqa: E731
    parts = [_cifar_batch(_unpickle(members[m], where(m)), layout, where(m)) for m in layout.train_members]
    test_x, test_y = _cifar_batch(_unpickle(members[layout.test_member], where(layout.test_member)), layout,
                                  where(layout.test_member))
    meta = _unpickle(members[layout.meta_member], where(layout.meta_member))
    names = meta.get(layout.names_key)
    if names is None or len(names) != layout.n_classes:
        raise DataError(f"{where(layout.meta_member)}: {layout.names_key!r} must list {layout.n_classes} class names")
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    ds = RawDataset(
        name, np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
        test_x, test_y, names, str(path),
    )
    _check_every_class(ds)
    return ds


def _check_every_class(ds: RawDataset) -> None:
    for split, labels in (("training", ds.train_labels), ("test", ds.test_labels)):
        counts = np.bincount(labels, minlength=ds.n_classes)
        empty = np.flatnonzero(counts == 0)
        if empty.size:
            raise DataError(f"{ds.source}: the {split} split has no image of class(es) {empty[:5].tolist()}; "
                            f"the data is incomplete, replace it")
        # Every source is balanced; one lost image would otherwise shrink n_max, and with it every
        # class's long-tailed count, without a word.
        short = np.flatnonzero(counts < counts.max())
        if short.size:
            c = int(short[0])
            raise DataError(f"{ds.source}: class {c} has {counts[c]} {split} images where the others have up to "
                            f"{counts.max()} ({short.size} class(es) short); the data is incomplete, replace it")


# ---- TinyImageNet: tiny-imagenet-200/{wnids.txt, words.txt, train/<wnid>/images, val/}

def _decode_jpegs(blobs: list[bytes], names: list[str]) -> np.ndarray:
    """`names[i]` says where blob i came from, for the error that names a bad image."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    def one(item: tuple[int, bytes]) -> np.ndarray:
        i, b = item
        try:
            with Image.open(io.BytesIO(b)) as im:
                return np.asarray(im.convert("RGB"))  # a few TinyImageNet images are greyscale
        except Exception as e:
            raise DataError(f"{names[i]} cannot be decoded ({type(e).__name__}); replace the data") from None

    with ThreadPoolExecutor(4) as pool:  # PIL releases the GIL while decoding
        images = list(pool.map(one, enumerate(blobs)))
    bad = next((i for i, im in enumerate(images) if im.shape != (64, 64, 3)), None)
    if bad is not None:
        raise DataError(f"{names[bad]}: TinyImageNet images must be 64x64 RGB, found {images[bad].shape[:2]}")
    return np.stack(images)


class _TinyFiles:
    """Uniform access to the tiny-imagenet-200 tree in a folder or a zip."""

    def __init__(self, path: Path):
        self.path = path
        self._children: dict[str, list[str]] | None = None
        if path.is_dir():
            self._zip = None
            # os.walk, not rglob: Python 3.11's rglob does not enter a linked folder (train/ kept on
            # another disk), and its images would read as missing.
            self.names = {(Path(d) / f).relative_to(path).as_posix()
                          for d, _, fs in os.walk(path, followlinks=True) for f in fs}
            self.prefix = ""
            if "wnids.txt" not in self.names:
                self._too_deep()
        else:
            try:
                self._zip = zipfile.ZipFile(path)
                # __MACOSX/: the resource forks macOS's Archive Utility adds, one for every file.
                self.names = {n for n in self._zip.namelist() if not n.startswith("__MACOSX/")}
            except (zipfile.BadZipFile, OSError, EOFError) as e:
                raise DataError(f"{path}: not a readable zip ({type(e).__name__}); "
                                f"the file is truncated or corrupt, replace it") from None
            self.prefix = self._zip_top()

    def _tops(self) -> list[str]:
        """The folders that hold a wnids.txt, shallowest first."""
        return sorted((n[:-len("wnids.txt")] for n in self.names if n.endswith("/wnids.txt")),
                      key=lambda t: (t.count("/"), t))

    def _zip_top(self) -> str:
        # Like the CIFAR members, the tree reads under any folder name: a zip repacked from a renamed
        # folder holds the same images (what is read, and its hash, does not change).
        if "tiny-imagenet-200/wnids.txt" in self.names:
            return "tiny-imagenet-200/"
        if "wnids.txt" in self.names:
            return ""
        tops = self._tops()
        if len(tops) > 1:
            raise DataError(f"{self.path}: holds {len(tops)} copies of the data set (wnids.txt under "
                            f"{', '.join(tops[:3])}); repack it with one")
        return tops[0] if tops else ""

    def _too_deep(self) -> None:
        """A folder whose wnids.txt lies further down (extracted into a folder of the same name): say
        where, and how to point at it, rather than that wnids.txt is missing."""
        tops = self._tops()
        if not tops:
            return
        top = tops[0].rstrip("/")
        fix = (f"set data.root to {self.path}" if top == self.path.name
               else f"move the contents of {self.path / top} up into {self.path}")
        raise DataError(f"{self.path}: no wnids.txt at its top, but {self.path / top}/wnids.txt is there (extracted "
                        f"into a folder too deep); {fix}")

    def where(self, rel: str) -> str:
        """The file as the user finds it: a path, or the zip and the name inside it."""
        return str(self.path / rel) if self._zip is None else f"{self.path}:{self.prefix}{rel}"

    def has(self, rel: str) -> bool:
        return self.prefix + rel in self.names

    def read(self, rel: str) -> bytes:
        if not self.has(rel):
            raise DataError(f"{self.path}: {rel} missing; this is not a complete tiny-imagenet-200 copy")
        try:
            if self._zip is None:
                return (self.path / rel).read_bytes()
            return self._zip.read(self.prefix + rel)
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:  # zlib: damaged deflated data
            raise DataError(f"{self.path}: {rel} cannot be read ({type(e).__name__}); replace the data") from None

    def text(self, rel: str) -> str:
        try:
            return self.read(rel).decode()
        except UnicodeDecodeError:
            raise DataError(f"{self.path}: {rel} is not UTF-8 text; replace the data") from None

    def listdir(self, rel: str) -> list[str]:
        """The files in `rel`, less hidden ones: macOS's AppleDouble files (._x.JPEG, written beside
        each file by its tar and by copies to non-Mac disks) carry an image's name but no image."""
        if self._children is None:  # grouped once: a scan of every name per class took 20 s (200 x 120k)
            self._children = {}
            for n in self.names:
                head, _, base = n.rpartition("/")
                if base and not base.startswith("."):  # a zip's folder entries end in "/"
                    self._children.setdefault(head, []).append(base)
        return sorted(self._children.get((self.prefix + rel).rstrip("/"), []))


def read_tinyimagenet(path: Path) -> RawDataset:
    files = _TinyFiles(path)
    # Label = the class's line in wnids.txt (not sorted, as ImageFolder would): Mammoth's seq-tinyimg,
    # whose baselines the paper's TinyImageNet table reports, numbers its classes in that order, and
    # under `ordered` the label decides a class's size and task.
    wnids = files.text("wnids.txt").split()
    if len(wnids) != 200 or len(set(wnids)) != 200:
        raise DataError(f"{path}: wnids.txt must list 200 distinct class ids, found {len(set(wnids))}")
    words = {}
    if files.has("words.txt"):
        for line in files.read("words.txt").decode(errors="replace").splitlines():
            if "\t" in line:
                k, v = line.split("\t", 1)
                words[k] = v.split(",")[0].strip()
    index = {w: i for i, w in enumerate(wnids)}

    blobs, labels, names = [], [], []
    for c, w in enumerate(wnids):
        imgs = [f"train/{w}/images/{f}" for f in files.listdir(f"train/{w}/images")
                if f.lower().endswith((".jpeg", ".jpg", ".png"))]
        if not imgs:  # a wnid, not a class number, says which folder to look for
            raise DataError(f"{path}: no image in train/{w}/images for class {c} ({w}, line {c + 1} of "
                            f"wnids.txt); the data is incomplete, replace it")
        blobs += [files.read(f) for f in imgs]
        names += [files.where(f) for f in imgs]
        labels += [index[w]] * len(imgs)
    train_x = _decode_jpegs(blobs, names) if blobs else np.zeros((0, 64, 64, 3), np.uint8)

    # The official test split has no labels: val is the test set.
    t_blobs, t_labels, t_names = [], [], []
    for line in files.text("val/val_annotations.txt").splitlines():
        parts = line.split("\t")
        if len(parts) < 2:
            continue
        if parts[1] not in index:
            raise DataError(f"{path}: val/val_annotations.txt names unknown class {parts[1]!r}")
        t_blobs.append(files.read(f"val/images/{parts[0]}"))
        t_names.append(files.where(f"val/images/{parts[0]}"))
        t_labels.append(index[parts[1]])
    test_x = _decode_jpegs(t_blobs, t_names) if t_blobs else np.zeros((0, 64, 64, 3), np.uint8)
    ds = RawDataset("tinyimagenet", train_x, np.asarray(labels, np.int64), test_x, np.asarray(t_labels, np.int64),
                    [words.get(w, w) for w in wnids], str(path))
    _check_every_class(ds)
    return ds


# ---- locating and downloading

def _candidates(dataset: str, root: Path) -> list[Path]:
    if dataset == "cifar10":
        return [root / CIFAR10.folder, root / CIFAR10.archive]
    if dataset == "cifar100":
        return [root / CIFAR100.folder, root / CIFAR100.archive]
    return [root / "tiny-imagenet-200", root / "tiny-imagenet-200.zip"]


def _download(dataset: str, root: Path, cands: list[Path]) -> None:
    """Fetch the archive into `root`: into a temporary folder first, renamed when complete, under a
    lock, so concurrent runs (two queue workers) download once and a killed download leaves nothing."""
    import fcntl
    import shutil
    import tempfile

    url = {"cifar10": CIFAR10_URL, "cifar100": CIFAR100_URL, "tinyimagenet": TINYIMAGENET_URL}[dataset]
    try:
        from torchvision.datasets.utils import download_url

        root.mkdir(parents=True, exist_ok=True)
        with open(root / f".{dataset}.download.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if any(p.exists() for p in cands):  # another run fetched it while we waited
                return
            tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=root))
            try:
                # We only fetch the archive; reading (and validation by content) is ours.
                download_url(url, str(tmp))
                name = url.rsplit("/", 1)[-1]
                (tmp / name).replace(root / name)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except Exception as e:
        raise DataError(
            f"downloading {dataset} into {root} failed ({type(e).__name__}: {str(e)[:120]}); "
            f"fetch {url} by hand into {root}, or set data.root to a folder that holds it"
        ) from None


def raw_present(dataset: str, root: str | Path) -> bool:
    """Whether `root` holds `dataset` in a form load_raw reads (without reading it)."""
    return any(p.exists() for p in _candidates(dataset, Path(root)))


def check_raw(dataset: str, root: str | Path, download: bool = False) -> None:
    """The errors load_raw gives before it reads anything: data.root a file, or no data there and
    no download allowed."""
    root = Path(root)
    if root.is_file():  # the archive itself given: the candidates below would be names inside a file
        raise DataError(f"data.root {root} is a file; point data.root at the folder that holds it ({root.parent})")
    cands = _candidates(dataset, root)
    if root.name == cands[0].name and root.is_dir() and not any(p.exists() for p in cands):
        # The extracted folder itself given: a download would land inside it.
        raise DataError(f"data.root {root} is the extracted {dataset} folder itself; point data.root at the "
                        f"folder that holds it ({root.parent})")
    broken = [p for p in cands if p.is_symlink() and not p.exists()]
    if broken and not any(p.exists() for p in cands):  # a link to an archive moved or on an unmounted disk
        raise DataError(f"{broken[0]} is a link to {os.readlink(broken[0])}, which does not exist; link the "
                        f"archive again (ln -sf /path/to/{broken[0].name} {broken[0].parent}/)")
    if not download and not any(p.exists() for p in cands):
        looked = " or ".join(str(p) for p in cands)
        raise DataError(
            f"no {dataset} data in {root}: looked for {looked}; put the standard archive there "
            f"(or point data.root at the folder holding it), or set data.download: true"
        )


def load_raw(dataset: str, root: str | Path, download: bool = False) -> RawDataset:
    """Read `dataset` from `root` (archive or extracted folder), downloading it when allowed."""
    root = Path(root)
    check_raw(dataset, root, download)
    cands = _candidates(dataset, root)
    path = next((p for p in cands if p.exists()), None)
    if path is None:
        _download(dataset, root, cands)
        path = next((p for p in cands if p.exists()), None)
    if path is None:
        check_raw(dataset, root)  # fetched and still not there: the same line as never fetched
    try:
        if dataset == "cifar10":
            return read_cifar(CIFAR10, path, "cifar10")
        if dataset == "cifar100":
            return read_cifar(CIFAR100, path, "cifar100")
        return read_tinyimagenet(path)
    except DataError as e:
        # The folder is read when both are there. One that does not read (half-extracted, or being
        # extracted now) is reported, not swapped for the archive: which copy was read would then
        # depend on a fault the user never hears of, and the manifest keeps only the content hash.
        if path == cands[0] and cands[1].exists():
            raise DataError(f"{e}; {cands[1]} is also there: remove the incomplete folder to use it") from None
        raise
