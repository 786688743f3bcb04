# Placeholder until the "Ship it" issue: the GPU image (CUDA PyTorch base, DALI, FFCV, pillow-simd)
# is not written yet. It installs turbotrain on a CUDA-enabled PyTorch base image.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
WORKDIR /opt/turbotrain
COPY . .
RUN pip install --no-cache-dir .
ENTRYPOINT ["turbotrain"]
