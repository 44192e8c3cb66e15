"""Prints the install requirements of an sglang wheel that a CPU-only machine can install.

SGLang's wheel requires, unconditionally, many packages that exist only for CUDA (kernels,
FlashInfer, DeepEP, CUTLASS, NVSHMEM, …) or that its CPU engine never imports on our path
(audio and video decoding). They are left out, and so are extras-only requirements; everything
else is printed as the wheel states it (`torch==2.14.1` from the registry runs on CPU).
Usage: sglang_requirements.py WHEEL
"""

import re
import sys
import zipfile

# Distribution names (normalized) the CPU engine does without.
CUDA_ONLY = {
    "cuda-python",
    "flash-attn-4",
    "flashinfer-python",
    "humming-kernels",
    "nvidia-cutlass-dsl",
    "nvidia-mathdx",
    "nvshmem4py-cu13",
    "quack-kernels",
    "sgl-deep-ep",
    "sgl-deep-gemm",
    "sgl-flash-mla",
    "sgl-kernel",
    "sglang-kernel",
    "tilelang",
    "torch-memory-saver",
}
UNUSED_MEDIA = {"av", "decord2", "timm", "torchaudio", "torchcodec"}


def name_of(req: str) -> str:
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else ""


def main() -> None:
    with zipfile.ZipFile(sys.argv[1]) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(name).decode()
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req or name_of(req) in CUDA_ONLY | UNUSED_MEDIA:
            continue
        print(req)


if __name__ == "__main__":
    main()
