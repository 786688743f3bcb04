"""What feeds the model in bench/gpu_check.py: our registered pipelines, DALI without the
hardware decoder, FFCV, and `plain_torchvision_nvjpeg`, a GPU decode path without DALI
(torchvision.io's batched ``decode_jpeg(device="cuda")``, our crop boxes cut and resized on the
device). It is measured here, not registered: it becomes a pipeline only if it reaches 90 % of
the synthetic bound (gpu_check's verdict line says which).

Also the cv2 stand-in for simplejpeg, for a GPU box without simplejpeg's wheel.
"""
from __future__ import annotations

import sys


def install_simplejpeg_stand_in() -> None:
    """A cv2-backed `simplejpeg` module: what `pytorch`/`resident` call (decode, encode, the
    header), no more."""
    import types

    import cv2
    import numpy as np

    def decode_jpeg(data, colorspace="rgb", fastdct=False, fastupsample=False, min_height=0,
                    min_width=0, min_factor=1.0, buffer=None, strict=True):
        raw = np.frombuffer(memoryview(data), dtype=np.uint8)
        flags = cv2.IMREAD_COLOR
        for factor, reduced in ((8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4),
                                (2, cv2.IMREAD_REDUCED_COLOR_2)):
            if min_factor >= factor:
                flags = reduced
                break
        image = cv2.imdecode(raw, flags)
        if image is None:
            raise ValueError("cv2 could not decode the JPEG")
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if colorspace.lower() == "rgb" else image

    def encode_jpeg(image, quality=85, colorspace="rgb", colorsubsampling="420", fastdct=True):
        bgr = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2BGR)
        return cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])[1].tobytes()

    def decode_jpeg_header(data, min_height=0, min_width=0, min_factor=1.0, strict=True):
        """(height, width, colour space, subsampling), from our own marker parser."""
        from turbotrain.datasets.beton.jpeg_header import read_jpeg_header
        header = read_jpeg_header(bytes(memoryview(data)))  # ValueError when malformed
        return header.height, header.width, "Gray" if header.components == 1 else "YCbCr", "?"

    module = types.ModuleType("simplejpeg")
    module.decode_jpeg, module.encode_jpeg, module.__version__ = decode_jpeg, encode_jpeg, "cv2"
    module.decode_jpeg_header = decode_jpeg_header
    sys.modules["simplejpeg"] = module


class TorchvisionDecode:
    """GPU decode without DALI: torchvision.io's batched nvJPEG decode, then the shared crop
    boxes cut, resized and flipped for the whole batch at once: one ResizedCrops per distinct
    image size, the same resampler as `resident` on CUDA (batched_crops.ResizedCrops). Same
    order and boxes as every pipeline."""
    name = "plain_torchvision_nvjpeg"

    def __init__(self, dataset, settings, seed: int = 0):
        from turbotrain.pipeline.order import SampleOrder
        self.dataset, self.settings, self.seed = dataset, settings, seed
        self.order = SampleOrder(len(dataset), batch_size=settings.batch_size, seed=seed)
        self.epoch = 0

    def __len__(self):
        return len(self.order)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def close(self) -> None:
        pass

    def __iter__(self):
        import numpy as np
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg
        from turbotrain.pipeline import augment
        from turbotrain.pipeline.batched_crops import ResizedCrops
        device, s, ds = torch.device(self.settings.device), self.settings.image_size, self.dataset
        for indices in self.order.batches(self.epoch):
            data = [torch.from_numpy(np.array(ds.beton.payload(i))) for i in indices]
            decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)  # CHW each
            boxes = augment.crop_boxes(augment.RESIZED_CROP, seed=self.seed, epoch=self.epoch,
                                       indices=indices, heights=ds.heights[indices],
                                       widths=ds.widths[indices], image_size=s)
            table = torch.from_numpy(np.stack([boxes.top, boxes.left, boxes.height,
                                               boxes.width, boxes.flip.astype(np.int64)],
                                              axis=1).astype(np.int64)).to(device)
            out = torch.empty((len(indices), s, s, 3), dtype=torch.uint8, device=device)
            groups: dict[tuple, list[int]] = {}
            for k, image in enumerate(decoded):
                groups.setdefault(tuple(image.shape), []).append(k)
            for members in groups.values():
                store = torch.stack([decoded[k] for k in members]).permute(0, 2, 3, 1)
                rows = torch.tensor(members, device=device)
                crops = ResizedCrops(store.contiguous(), s, threads=1)
                try:
                    out[rows] = crops(torch.arange(len(members), device=device), table[rows])
                finally:
                    crops.close()
            labels = torch.from_numpy(ds.labels[indices]).to(device, non_blocking=True)
            yield out.permute(0, 3, 1, 2), labels


def sources(dataset, settings, report):
    """[(name, builder)] of everything that can feed the model here."""
    import torch
    from turbotrain.pipeline import build_pipeline
    device = torch.device(settings.device)
    options = dict(train=True, batch_size=settings.batch_size, image_size=settings.image_size,
                   device=device, seed=0)
    stand_in = "" if report.engines["simplejpeg"] else " (cv2 decode)"
    out = [(n + stand_in, lambda n=n: build_pipeline(n, dataset, **options))
           for n in ("pytorch", "resident")]
    if report.engines["dali"]:
        from turbotrain.pipeline.base import PipelineOptions
        from turbotrain.pipeline.dali import DaliPipeline
        out.append(("dali", lambda: build_pipeline("dali", dataset, **options)))
        if device.type == "cuda":  # default: hardware decoder where present; 0: CUDA only
            out.append(("dali_no_hw_decoder", lambda: DaliPipeline(
                dataset, PipelineOptions(**options), hw_decoder_load=0.0)))
    if report.engines["ffcv"]:
        out.append(("ffcv", lambda: build_pipeline("ffcv", dataset, **options)))
    if report.engines["torchvision"]:
        out.append((TorchvisionDecode.name, lambda: TorchvisionDecode(dataset, settings)))
    return out

