"""The .beton writer and reader: round trips, FFCV compatibility both ways, and a fuzzer."""
from __future__ import annotations


import numpy as np
import pytest
import simplejpeg

from turbotrain.datasets import BetonFile, DatasetError, open_dataset
from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.writer import BetonWriter, SampleTooLarge


def make_images(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    images = []
    for i in range(n):
        h, w = 24 + (i % 3) * 8, 40 - (i % 2) * 8
        # smooth content so JPEG round trips are close
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 5, y * 7, (x + y) * 3], axis=-1) + rng.integers(0, 40, 3)
        images.append(np.clip(base, 0, 255).astype(np.uint8))
    return images


def write_mixed(path, images, labels) -> None:
    """Even samples as JPEG, odd ones raw: both per-sample modes in one file."""
    with BetonWriter(path, capacity=len(images) + 3) as w:
        for i, (image, label) in enumerate(zip(images, labels)):
            h, wd = image.shape[:2]
            if i % 2 == 0:
                w.append(layout.MODE_JPEG, h, wd, simplejpeg.encode_jpeg(image, quality=95), label)
            else:
                w.append(layout.MODE_RAW, h, wd, image.tobytes(), label)


@pytest.fixture
def mixed_file(tmp_path):
    images = make_images(30)
    labels = [i % 7 for i in range(30)]
    path = tmp_path / "mixed.beton"
    write_mixed(path, images, labels)
    return path, images, labels


def test_round_trip_raw_exact_jpeg_close(mixed_file):
    path, images, labels = mixed_file
    ds = open_dataset(path)
    assert len(ds) == 30 and ds.classes is None and ds.num_classes == 7
    assert ds.labels.dtype == np.int64 and ds.labels.tolist() == labels
    for i, image in enumerate(images):
        decoded = ds.image(i)
        assert decoded.shape == image.shape and decoded.dtype == np.uint8
        if i % 2:
            np.testing.assert_array_equal(decoded, image)
            stored, label = ds.read(i)
            np.testing.assert_array_equal(stored, image)
        else:
            assert np.abs(decoded.astype(int) - image).mean() < 3
            stored, label = ds.read(i)
            assert bytes(stored[:2]) == b"\xff\xd8"
        assert label == labels[i]


def test_layout_matches_ffcv_types(mixed_file):
    """Spot-check the layout against FFCV's own dtypes (ffcv/types.py)."""
    from ffcv import types as ffcv_types
    from ffcv.fields import IntField, RGBImageField
    assert layout.HEADER_DTYPE == ffcv_types.HeaderType
    assert layout.FIELD_DESC_DTYPE == ffcv_types.FieldDescType
    assert layout.ALLOC_DTYPE == ffcv_types.ALLOC_TABLE_TYPE
    ours = layout.metadata_dtype([layout.TYPE_RGB_IMAGE, layout.TYPE_INT])
    theirs = ffcv_types.get_metadata_type([RGBImageField(), IntField()])
    assert ours.itemsize == theirs.itemsize and ours.descr == theirs.descr
    assert layout.BETON_VERSION == ffcv_types.CURRENT_VERSION


@pytest.mark.timeout(240)
def test_ffcv_loader_reads_our_file(mixed_file):
    path, images, labels = mixed_file
    from ffcv.fields.decoders import IntDecoder, SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    # SimpleRGBImageDecoder needs one size: write a same-size file for it.
    same = [img[:24, :32] for img in images]
    same = [np.ascontiguousarray(s) for s in same]
    path2 = path.with_name("same.beton")
    write_mixed(path2, same, labels)
    loader = Loader(str(path2), batch_size=8, num_workers=1, order=OrderOption.SEQUENTIAL,
                    drop_last=False,
                    pipelines={"image": [SimpleRGBImageDecoder()], "label": [IntDecoder()]})
    got_images, got_labels = [], []
    for x, y in loader:
        got_images.append(np.array(x))
        got_labels.append(np.array(y).ravel())
    got = np.concatenate(got_images)
    assert np.concatenate(got_labels).tolist() == labels
    ours = open_dataset(path2)
    for i in range(len(same)):
        if i % 2:
            np.testing.assert_array_equal(got[i], same[i])
        # FFCV decodes with libturbojpeg's fast DCT/upsampling flags, we with simplejpeg's
        # accurate ones: the same pixels within a few levels.
        assert np.abs(got[i].astype(int) - ours.image(i)).mean() < 3


@pytest.mark.usefixtures("child_processes")
@pytest.mark.timeout(240)
def test_we_read_a_file_written_by_ffcv(tmp_path):
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    images = make_images(25, seed=3)
    labels = [(3 * i) % 5 for i in range(25)]

    class Indexed:
        def __len__(self):
            return len(images)

        def __getitem__(self, i):
            return images[i], labels[i]

    for mode in ("raw", "jpg"):
        path = tmp_path / f"ffcv_{mode}.beton"
        writer = DatasetWriter(str(path), {"image": RGBImageField(write_mode=mode),
                                           "label": IntField()}, num_workers=1)
        writer.from_indexed_dataset(Indexed())
        ds = open_dataset(path)
        assert ds.labels.tolist() == labels
        for i, image in enumerate(images):
            if mode == "raw":
                np.testing.assert_array_equal(ds.image(i), image)
            else:
                assert np.abs(ds.image(i).astype(int) - image).mean() < 4


def test_skipped_samples_leave_a_valid_file(tmp_path):
    """Fewer samples than reserved (skipped inputs): the header records the real count."""
    path = tmp_path / "short.beton"
    images = make_images(3)
    with BetonWriter(path, capacity=10) as w:
        for image in images:
            w.append(layout.MODE_RAW, *image.shape[:2], image.tobytes(), 1)
    ds = open_dataset(path)
    assert len(ds) == 3
    np.testing.assert_array_equal(ds.image(2), images[2])


def test_empty_split_reads_as_empty(tmp_path):
    path = tmp_path / "empty.beton"
    with BetonWriter(path, capacity=0):
        pass
    assert len(BetonFile(path)) == 0


def test_sample_larger_than_a_page_is_refused(tmp_path):
    with BetonWriter(tmp_path / "big.beton", capacity=1, page_size=layout.MIN_PAGE_SIZE) as w:
        with pytest.raises(SampleTooLarge, match="--max-side"):
            w.append(layout.MODE_RAW, 1000, 1000, bytes(3_000_000), 0)


def test_samples_never_cross_pages(tmp_path):
    path = tmp_path / "pages.beton"
    payload = bytes(1000 * 233 * 3)  # 699,000 bytes: three fit in a 2 MiB page, four do not
    with BetonWriter(path, capacity=9, page_size=layout.MIN_PAGE_SIZE) as w:
        for _ in range(9):
            w.append(layout.MODE_RAW, 1000, 233, payload, 0)
    b = BetonFile(path)
    pages_start = b.data_ptrs // b.page_size
    pages_end = (b.data_ptrs + b.sizes - 1) // b.page_size
    assert (pages_start == pages_end).all()
    assert (b.data_ptrs % b.page_size == 0).sum() == 3


@pytest.mark.usefixtures("child_processes")
def test_a_split_is_a_map_style_dataset_for_torch_dataloader(tmp_path):
    """split[i] is (decoded image, label), so torch's DataLoader indexes a split as it is, in
    worker processes too (the split pickles without its maps); past the end is IndexError."""
    import torch
    path = tmp_path / "raw.beton"
    images = [np.full((8, 8, 3), 10 * i, np.uint8) for i in range(6)]
    with BetonWriter(path, capacity=6) as w:
        for i, image in enumerate(images):
            w.append(layout.MODE_RAW, 8, 8, image.tobytes(), i)
    ds = open_dataset(path)
    image, label = ds[2]
    assert np.array_equal(image, images[2]) and label == 2
    assert ds[-1][1] == 5
    with pytest.raises(IndexError, match="sample 6 out of range"):
        ds[6]
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2)
    batches = list(loader)
    assert [b[1].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]
    assert batches[1][0].shape == (3, 8, 8, 3) and batches[1][0].dtype == torch.uint8
    assert int(batches[1][0][2, 0, 0, 0]) == 50


def test_pages_start_after_the_metadata_and_the_file_ends_after_the_last_sample(tmp_path):
    """Page k is bytes [k x P, (k+1) x P): the first is the rest of the page the metadata ends
    in, a sample that does not fit there opens the next whole page, and the allocation table
    follows the last sample (no page-sized padding at either end)."""
    path = tmp_path / "small.beton"
    payload = bytes(700_000)
    with BetonWriter(path, capacity=4, page_size=layout.MIN_PAGE_SIZE) as w:
        for _ in range(4):  # 2 fit beside the metadata in page 0, 2 in page 1
            w.append(layout.MODE_RAW, 1000, 233, payload[:699_000], 0)
    b = BetonFile(path)
    page = layout.MIN_PAGE_SIZE
    assert int(b.data_ptrs[0]) == b.metadata_end  # right after the metadata
    assert (b.data_ptrs // page).tolist() == [0, 0, 1, 1]
    assert int(b.data_ptrs[2]) == page
    assert b.alloc_table_ptr == page + 2 * 699_000 == path.stat().st_size - 4 * 24
    assert bytes(b.payload(3)) == payload[:699_000]


def test_wrong_version_and_not_a_dataset(tmp_path, mixed_file):
    path, _, _ = mixed_file
    data = bytearray(path.read_bytes())
    data[0:2] = (7).to_bytes(2, "little")
    bad = tmp_path / "v7.beton"
    bad.write_bytes(data)
    with pytest.raises(DatasetError, match="version 7"):
        open_dataset(bad)
    junk = tmp_path / "junk.beton"
    junk.write_bytes(b"hello")
    with pytest.raises(DatasetError, match="not a dataset"):
        open_dataset(junk)
    with pytest.raises(DatasetError, match="no such dataset"):
        open_dataset(tmp_path / "missing")


def _check_never_garbage(path) -> None:
    """Opening either fails with DatasetError or gives samples that decode to their declared
    shape or fail with DatasetError: never another exception, a crash or out-of-file bytes."""
    try:
        ds = open_dataset(path)
    except DatasetError:
        return
    for i in range(len(ds)):
        try:
            image = ds.image(i)
        except DatasetError:
            continue
        assert image.shape == (int(ds.heights[i]), int(ds.widths[i]), 3)
        assert image.dtype == np.uint8


@pytest.mark.timeout(240)
def test_fuzz_truncations_and_flipped_bytes(tmp_path, mixed_file):
    path, _, _ = mixed_file
    original = path.read_bytes()
    b = BetonFile(path)
    regions = {
        "header": (0, layout.HEADER_DTYPE.itemsize),
        "fields": (layout.HEADER_DTYPE.itemsize, layout.metadata_offset(2)),
        "metadata": (layout.metadata_offset(2), b.metadata_end),
        "alloc": (b.alloc_table_ptr, len(original)),
        "data": (int(b.data_ptrs.min()), int(b.data_ptrs.max() + b.sizes.max())),
    }
    rng = np.random.default_rng(1234)
    target = tmp_path / "fuzz.beton"
    for length in sorted(set(rng.integers(0, len(original), 60).tolist())
                         | {0, 1, 23, 24, 1065, len(original) - 1, b.alloc_table_ptr}):
        target.write_bytes(original[:length])
        _check_never_garbage(target)
    for name, (lo, hi) in regions.items():
        for _ in range(120):
            data = bytearray(original)
            for _ in range(int(rng.integers(1, 4))):
                pos = int(rng.integers(lo, hi))
                data[pos] = int(rng.integers(0, 256))
            target.write_bytes(data)
            _check_never_garbage(target)
