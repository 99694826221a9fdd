import io
import pickle

import numpy as np
import pytest

import fakedata
from conftest import REAL_CIFAR10, real_cifar10
from pbr.data import sources
from pbr.data.sources import load_raw
from pbr.errors import DataError


@pytest.mark.parametrize("form", ["archive", "folder"])
def test_cifar10_round_trip(tmp_path, form):
    fakedata.write_cifar(tmp_path, 10, 40, 6, form=form)
    ds = load_raw("cifar10", tmp_path)
    xtr, ytr, xte, yte = fakedata.cifar_arrays(10, 40, 6)
    assert ds.train_images.shape == (400, 32, 32, 3) and ds.train_images.dtype == np.uint8
    assert np.array_equal(ds.train_images, xtr) and np.array_equal(ds.train_labels, ytr)
    assert np.array_equal(ds.test_images, xte) and np.array_equal(ds.test_labels, yte)
    assert ds.class_names == [f"class{c}" for c in range(10)]


@pytest.mark.parametrize("form", ["archive", "folder"])
def test_cifar100_round_trip(tmp_path, form):
    fakedata.write_cifar(tmp_path, 100, 5, 2, form=form)
    ds = load_raw("cifar100", tmp_path)
    xtr, ytr, _, yte = fakedata.cifar_arrays(100, 5, 2)
    assert np.array_equal(ds.train_images, xtr) and np.array_equal(ds.train_labels, ytr)
    assert np.array_equal(ds.test_labels, yte)
    assert len(ds.class_names) == 100 and ds.class_names[3] == "fine3"


def test_repacked_archive_loads(tmp_path):
    # Other member order, other compression, same content: content decides, not MD5.
    members = fakedata.cifar_members(10, 20, 4)
    a = tmp_path / "a"
    b = tmp_path / "b"
    fakedata.write_cifar(a, 10, members=members)
    fakedata.write_cifar(b, 10, members=members, order=sorted(members, reverse=True), mode="w:bz2")
    assert load_raw("cifar10", a).content_hash() == load_raw("cifar10", b).content_hash()


@pytest.mark.parametrize("form", ["folder", "zip"])
def test_tinyimagenet_round_trip(tmp_path, form):
    fakedata.write_tinyimagenet(tmp_path, 2, 1, form=form)
    ds = load_raw("tinyimagenet", tmp_path)
    assert ds.train_images.shape == (400, 64, 64, 3) and ds.test_images.shape == (200, 64, 64, 3)
    assert np.bincount(ds.train_labels).tolist() == [2] * 200
    assert np.bincount(ds.test_labels).tolist() == [1] * 200
    # Class c is wnids.txt's line c (Mammoth's numbering), not the c-th wnid in sorted order (the
    # fake's file is descending); names from words.txt.
    wnids = (tmp_path / "tiny-imagenet-200" / "wnids.txt").read_text().split() if form == "folder" else None
    assert wnids is None or wnids != sorted(wnids)
    assert ds.class_names[:2] == ["thing 0", "thing 1"] and ds.class_names[-1] == "thing 199"
    # JPEG is lossy: the decoded image is close to the one written, not equal.
    want = fakedata.smooth_pixels(21, 400).astype(int)
    assert np.abs(ds.train_images[0].astype(int) - want[0]).mean() < 3
    # A greyscale JPEG (as some real ones are) arrives as three equal channels of its luma.
    grey = ds.train_images[fakedata.GREY - 1].astype(int)
    assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 1] == grey[..., 2]).all()
    luma = want[fakedata.GREY - 1] @ np.array([0.299, 0.587, 0.114])
    assert np.abs(grey[..., 0] - luma).mean() < 3


def test_missing_data_says_where_it_looked(tmp_path):
    with pytest.raises(DataError, match=r"no cifar10 data in .*cifar-10-batches-py or .*cifar-10-python.tar.gz"):
        load_raw("cifar10", tmp_path, download=False)


@pytest.mark.parametrize("download", [False, True])
def test_a_broken_link_to_the_archive_says_it_is_broken(tmp_path, download):
    """The set-up the docs give (ln -s the shared archive into data/raw) after the archive moved: the
    message said no data was there, naming the link, or a download was tried over it."""
    (tmp_path / "cifar-10-python.tar.gz").symlink_to(tmp_path / "moved" / "cifar-10-python.tar.gz")
    with pytest.raises(DataError, match=r"cifar-10-python.tar.gz is a link to .*moved/cifar-10-python.tar.gz, which "
                                        r"does not exist; link the archive again"):
        load_raw("cifar10", tmp_path, download=download)


def test_the_archive_given_as_the_root_names_its_folder(tmp_path):
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(b"")
    for download in (False, True):  # nothing is fetched into a file's place either
        with pytest.raises(DataError, match=f"data.root {archive} is a file; point data.root at the folder that "
                                            f"holds it \\({tmp_path}\\)"):
            load_raw("cifar10", archive, download=download)


def test_data_root_at_the_extracted_folder_itself_names_its_parent(tmp_path):
    fakedata.write_cifar(tmp_path, form="folder")
    folder = tmp_path / "cifar-10-batches-py"
    before = sorted(p.name for p in folder.iterdir())
    for download in (False, True):  # nothing is fetched into the data set's own folder either
        with pytest.raises(DataError, match=f"data.root {folder} is the extracted cifar10 folder itself; point "
                                            f"data.root at the folder that holds it \\({tmp_path}\\)"):
            load_raw("cifar10", folder, download=download)
    assert sorted(p.name for p in folder.iterdir()) == before
    assert load_raw("cifar10", tmp_path).name == "cifar10"  # its parent reads


def test_failed_download_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CIFAR100_URL", "http://127.0.0.1:9/cifar-100-python.tar.gz")
    with pytest.raises(DataError, match=r"downloading cifar100 into .* failed .* fetch .* by hand"):
        load_raw("cifar100", tmp_path, download=True)


def test_download_lands_whole_and_leaves_no_temporary_files(tmp_path, monkeypatch):
    import functools
    import http.server
    import threading

    served = fakedata.write_cifar(tmp_path / "server", 10, 20, 4)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(sources, "CIFAR10_URL", f"http://127.0.0.1:{server.server_port}/{served.name}")
    root = tmp_path / "raw"
    try:
        ds = load_raw("cifar10", root, download=True)
    finally:
        server.shutdown()
    assert len(ds.train_labels) == 200
    assert (root / served.name).read_bytes() == served.read_bytes()
    assert not list(root.glob(".download-*"))
    # Present now: a second load does not fetch again (the served file is gone).
    served.unlink()
    assert load_raw("cifar10", root, download=True).content_hash() == ds.content_hash()


def test_truncated_archive(tmp_path):
    p = fakedata.write_cifar(tmp_path, 10, 40, 6)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(DataError, match="truncated or corrupt"):
        load_raw("cifar10", tmp_path)


def test_missing_member(tmp_path):
    members = fakedata.cifar_members(10, 20, 4)
    del members["data_batch_3"]
    fakedata.write_cifar(tmp_path, 10, members=members)
    with pytest.raises(DataError, match="member.s. missing: data_batch_3"):
        load_raw("cifar10", tmp_path)


def test_corrupt_pickle(tmp_path):
    members = fakedata.cifar_members(10, 20, 4)
    members["test_batch"] = members["test_batch"][:100]
    fakedata.write_cifar(tmp_path, 10, members=members, form="folder")
    with pytest.raises(DataError, match="test_batch: not a readable CIFAR pickle"):
        load_raw("cifar10", tmp_path)


@pytest.mark.parametrize("break_it,msg", [
    (lambda d: d.pop(b"data"), "key b'data' missing"),
    (lambda d: d.update({b"data": d[b"data"][:, :100]}), "rows of 3072"),
    (lambda d: d.update({b"labels": d[b"labels"][:-1]}), "images but .* labels"),
    (lambda d: d.update({b"labels": [12] * len(d[b"labels"])}), r"labels outside 0..9"),
])
def test_bad_content(tmp_path, break_it, msg):
    members = fakedata.cifar_members(10, 20, 4)
    d = pickle.loads(members["data_batch_2"], encoding="bytes")
    break_it(d)
    members["data_batch_2"] = pickle.dumps(d, protocol=2)
    fakedata.write_cifar(tmp_path, 10, members=members)
    with pytest.raises(DataError, match=msg):
        load_raw("cifar10", tmp_path)


def test_class_missing_from_a_split(tmp_path):
    members = fakedata.cifar_members(10, 20, 4)
    d = pickle.loads(members["test_batch"], encoding="bytes")
    d[b"labels"] = [0 if y == 4 else y for y in d[b"labels"]]
    members["test_batch"] = pickle.dumps(d, protocol=2)
    fakedata.write_cifar(tmp_path, 10, members=members)
    with pytest.raises(DataError, match=r"test split has no image of class\(es\) \[4\]"):
        load_raw("cifar10", tmp_path)


def test_tinyimagenet_corrupt_zip_and_bad_image(tmp_path):
    p = fakedata.write_tinyimagenet(tmp_path / "a", 1, 1, form="zip")
    p.write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(DataError, match="not a readable zip"):
        load_raw("tinyimagenet", tmp_path / "a")
    p = fakedata.write_tinyimagenet(tmp_path / "b", 1, 1, form="folder")
    (p / "val" / "images" / "val_7.JPEG").write_bytes(b"not a jpeg")
    # The file, not its place in a list of 10,000 ("image 7").
    with pytest.raises(DataError, match=f"^{p}/val/images/val_7.JPEG cannot be decoded \\(UnidentifiedImageError\\); "
                                        f"replace the data$"):
        load_raw("tinyimagenet", tmp_path / "b")


@real_cifar10
def test_real_cifar10():
    ds = load_raw("cifar10", REAL_CIFAR10.parent)
    assert ds.train_images.shape == (50000, 32, 32, 3) and ds.test_images.shape == (10000, 32, 32, 3)
    assert np.bincount(ds.train_labels).tolist() == [5000] * 10
    assert ds.class_names[0] == "airplane" and ds.class_names[9] == "truck"


def test_a_cifar_archive_whose_checksum_fails_is_corrupt(tmp_path):
    """gzip checks its CRC only at the end of the stream, which the members' reading stops short of: a
    flipped bit in a member would load as altered pixels. Here the trailer's CRC is flipped."""
    archive = fakedata.write_cifar(tmp_path, 10, 4, 2)
    data = bytearray(archive.read_bytes())
    data[-8] ^= 0x01  # the gzip trailer: CRC-32, then the size
    archive.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"not a readable CIFAR-10 archive \(BadGzipFile: CRC check failed"):
        load_raw("cifar10", tmp_path)


def test_tinyimagenet_damaged_deflate_data_and_text_that_is_not_utf8(tmp_path):
    import zipfile

    stored = fakedata.write_tinyimagenet(tmp_path / "a", 1, 1, form="zip")
    with zipfile.ZipFile(stored) as z:  # the official zip deflates its members; fakedata stores them
        members = {i.filename: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(stored, "w", zipfile.ZIP_DEFLATED) as z:
        for name, blob in members.items():
            z.writestr(name, blob)
    with zipfile.ZipFile(stored) as z:
        info = z.getinfo(next(n for n in members if n.endswith("wnids.txt")))
    data = bytearray(stored.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # the local header's size
    data[start] ^= 0xFF  # the first deflate block's header
    stored.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"wnids.txt cannot be read \((error|BadZipFile)\); replace the data"):
        load_raw("tinyimagenet", tmp_path / "a")
    folder = fakedata.write_tinyimagenet(tmp_path / "b", 1, 1, form="folder")
    (folder / "wnids.txt").write_bytes(b"\xff\xfe not text")
    with pytest.raises(DataError, match=r"wnids.txt is not UTF-8 text; replace the data"):
        load_raw("tinyimagenet", tmp_path / "b")


def test_a_class_short_of_one_image_is_incomplete_data(tmp_path):
    """Every source is balanced: one image lost would shrink n_max, and every long-tailed count with
    it (500 -> 499 a class on TinyImageNet), under the benchmark's name."""
    members = fakedata.cifar_members(10, 20, 4)
    d = pickle.loads(members["data_batch_2"], encoding="bytes")
    drop = d[b"labels"].index(3)
    d[b"labels"] = d[b"labels"][:drop] + d[b"labels"][drop + 1:]
    d[b"data"] = np.delete(d[b"data"], drop, axis=0)
    members["data_batch_2"] = pickle.dumps(d, protocol=2)
    fakedata.write_cifar(tmp_path / "c", 10, members=members)
    with pytest.raises(DataError, match=r"class 3 has 19 training images where the others have up to 20 .* incomplete"):
        load_raw("cifar10", tmp_path / "c")
    p = fakedata.write_tinyimagenet(tmp_path / "t", 3, 1, form="folder")
    wnid = (p / "wnids.txt").read_text().split()[7]
    (p / "train" / wnid / "images" / f"{wnid}_2.JPEG").unlink()
    with pytest.raises(DataError, match=r"class 7 has 2 training images where the others have up to 3"):
        load_raw("tinyimagenet", tmp_path / "t")


def test_tinyimagenet_with_its_train_folder_linked_from_elsewhere(tmp_path):
    p = fakedata.write_tinyimagenet(tmp_path / "t", 1, 1, form="folder")
    (p / "train").rename(tmp_path / "elsewhere")
    (p / "train").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    ds = load_raw("tinyimagenet", tmp_path / "t")
    assert np.bincount(ds.train_labels).tolist() == [1] * 200


def test_the_fake_sets_keep_their_content_hash(tmp_path):
    """The hash recorded in every manifest: a change to how a valid copy is listed or read (order,
    files skipped) would make prepared data look foreign. CIFAR's hashes are pinned as literals;
    TinyImageNet's pixels depend on the JPEG decoder, so its order and labels are pinned instead."""
    from PIL import Image

    for n_classes, per_class, dataset, want in (
            (10, (4, 2), "cifar10", "84a5a2d524a7f2c264aeb5f854d9ca9952108ba798107723a52f4255f4a54de6"),
            (100, (2, 1), "cifar100", "05b74d7dec061d966259e3e0fc0c6bb42ffeff7dc4da2d73d0d71ad1cb0266b5")):
        for form in ("archive", "folder"):
            fakedata.write_cifar(tmp_path / form / dataset, n_classes, *per_class, form=form)
            assert load_raw(dataset, tmp_path / form / dataset).content_hash() == want, (dataset, form)
    folder = fakedata.write_tinyimagenet(tmp_path / "folder", 2, 1, form="folder")
    fakedata.write_tinyimagenet(tmp_path / "zip", 2, 1, form="zip")
    wnids = (folder / "wnids.txt").read_text().split()
    decode = lambda rel: np.asarray(Image.open(folder / rel).convert("RGB"))  # noqa: E731
    train = np.stack([decode(f"train/{w}/images/{w}_{i}.JPEG") for w in wnids for i in range(2)])
    test = np.stack([decode(f"val/images/val_{k}.JPEG") for k in range(200)])
    hashes = set()
    for form in ("folder", "zip"):
        ds = load_raw("tinyimagenet", tmp_path / form)
        assert np.array_equal(ds.train_images, train) and ds.train_labels.tolist() == [c for c in range(200) for _ in "ab"]
        assert np.array_equal(ds.test_images, test) and ds.test_labels.tolist() == list(range(200))
        assert ds.class_names == [f"thing {c}" for c in range(200)]
        hashes.add(ds.content_hash())
    assert len(hashes) == 1


@pytest.mark.parametrize("dataset", ["cifar100", "tinyimagenet"])
def test_an_incomplete_folder_beside_the_archive_names_the_archive(tmp_path, dataset):
    """The folder is read first; a half-extracted one beside a whole archive said only that the
    folder was incomplete. It is still not swapped for the archive without a word."""
    if dataset == "cifar100":
        archive = fakedata.write_cifar(tmp_path, 100, 2, 1)
        folder = fakedata.write_cifar(tmp_path, 100, 2, 1, form="folder")
        (folder / "train").unlink()
        first = f"{folder}: CIFAR-100 member\\(s\\) missing: train; replace the data"
    else:
        archive = fakedata.write_tinyimagenet(tmp_path, 1, 1, form="zip")
        folder = fakedata.write_tinyimagenet(tmp_path, 1, 1, form="folder")
        (folder / "wnids.txt").unlink()
        first = f"{folder}: wnids.txt missing; this is not a complete tiny-imagenet-200 copy"
    with pytest.raises(DataError, match=f"^{first}; {archive} is also there: remove the incomplete folder to use "
                                        f"it$"):
        load_raw(dataset, tmp_path)
    import shutil

    shutil.rmtree(folder)  # what the line says
    assert load_raw(dataset, tmp_path).source == str(archive)


def _rezip(path, edit) -> None:
    """Rewrite the zip at `path` with its members passed through `edit` ({name: bytes} -> same)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = edit({i.filename: z.read(i) for i in z.infolist()})
    with zipfile.ZipFile(path, "w") as z:
        for name, blob in members.items():
            z.writestr(name, blob)


def test_a_bad_training_image_in_the_zip_is_named(tmp_path):
    from PIL import Image

    z = fakedata.write_tinyimagenet(tmp_path / "a", 1, 1, form="zip")
    w = fakedata.tiny_wnids()[5]
    bad = f"tiny-imagenet-200/train/{w}/images/{w}_0.JPEG"
    _rezip(z, lambda m: {**m, bad: m[bad][:200]})  # cut short, as a killed copy leaves it
    with pytest.raises(DataError, match=f"^{z}:{bad} cannot be decoded \\(OSError\\); replace the data$"):
        load_raw("tinyimagenet", tmp_path / "a")
    small = io.BytesIO()
    Image.new("RGB", (32, 32)).save(small, format="JPEG")
    _rezip(z, lambda m: {**m, bad: small.getvalue()})
    with pytest.raises(DataError, match=f"^{z}:{bad}: TinyImageNet images must be 64x64 RGB, found \\(32, 32\\)$"):
        load_raw("tinyimagenet", tmp_path / "a")


@pytest.mark.parametrize("form", ["folder", "zip"])
def test_macos_appledouble_files_are_not_images(tmp_path, form):
    """macOS's tar, and its copies to a non-Mac disk, write `._<name>` beside every file (its
    Archive Utility puts them under __MACOSX/): an image's name and extension, no image."""
    clean = load_raw("tinyimagenet", fakedata.write_tinyimagenet(tmp_path / "clean", 1, 1, form=form).parent)
    p = fakedata.write_tinyimagenet(tmp_path / "mac", 1, 1, form=form)
    fork = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        "  # an AppleDouble header
    w = fakedata.tiny_wnids()[3]
    if form == "folder":
        (p / "train" / w / "images" / f"._{w}_0.JPEG").write_bytes(fork)
    else:
        rel = f"tiny-imagenet-200/train/{w}/images"
        _rezip(p, lambda m: {**m, f"{rel}/._{w}_0.JPEG": fork, f"__MACOSX/{rel}/._{w}_0.JPEG": fork,
                             "__MACOSX/tiny-imagenet-200/._wnids.txt": fork})
    assert load_raw("tinyimagenet", tmp_path / "mac").content_hash() == clean.content_hash()


def test_a_class_without_its_training_folder_names_the_folder(tmp_path):
    import shutil

    p = fakedata.write_tinyimagenet(tmp_path, 1, 1)
    w = fakedata.tiny_wnids()[4]
    shutil.rmtree(p / "train" / w)  # was: "the training split has no image of class(es) [4]"
    with pytest.raises(DataError, match=f"^{p}: no image in train/{w}/images for class 4 \\({w}, line 5 of "
                                        f"wnids.txt\\); the data is incomplete, replace it$"):
        load_raw("tinyimagenet", tmp_path)


def test_a_copy_one_folder_too_deep_says_where_it_is(tmp_path):
    want = load_raw("tinyimagenet", fakedata.write_tinyimagenet(tmp_path / "ok", 1, 1).parent).content_hash()
    outer = tmp_path / "raw" / "tiny-imagenet-200"
    fakedata.write_tinyimagenet(outer, 1, 1)  # unzipped inside a folder of the archive's own name
    with pytest.raises(DataError, match=f"^{outer}: no wnids.txt at its top, but {outer}/tiny-imagenet-200/wnids.txt "
                                        f"is there \\(extracted into a folder too deep\\); set data.root to {outer}$"):
        load_raw("tinyimagenet", tmp_path / "raw")
    assert load_raw("tinyimagenet", outer).content_hash() == want  # what the line says
    (outer / "tiny-imagenet-200").rename(outer / "copy")
    with pytest.raises(DataError, match=f"move the contents of {outer}/copy up into {outer}$"):
        load_raw("tinyimagenet", tmp_path / "raw")


def test_a_zip_repacked_under_another_folder_name_reads(tmp_path):
    """Names inside the zip are not content (as CIFAR's members read under any prefix): the same
    images, the same hash. Two copies in one zip are refused, not one picked."""
    z = fakedata.write_tinyimagenet(tmp_path, 1, 1, form="zip")
    want = load_raw("tinyimagenet", tmp_path).content_hash()
    rename = lambda m, top: {top + n.split("/", 1)[1]: b for n, b in m.items() if "/" in n}  # noqa: E731
    _rezip(z, lambda m: rename(m, "tiny/"))
    assert load_raw("tinyimagenet", tmp_path).content_hash() == want
    _rezip(z, lambda m: {**m, **rename(m, "backup/")})
    with pytest.raises(DataError, match=f"^{z}: holds 2 copies of the data set \\(wnids.txt under backup/, tiny/\\); "
                                        f"repack it with one$"):
        load_raw("tinyimagenet", tmp_path)

