"""A pure-Python stand-in for `sgl_kernel`, so that SGLang's CPU engine runs without its kernels.

SGLang's CPU engine imports a handful of `*_cpu` functions from `sgl_kernel` when its modules
load, and the package registry holds no CPU build of `sgl_kernel` (only CUDA libraries, no
source). With the settings the tests use (`--attention-backend torch_native`, no quantization,
no `torch.ops.sgl_kernel`), SGLang takes its torch-native paths and calls exactly one of them:
`assign_req_to_token_pool_cpu`, implemented here. Every other name imports as a function that
raises when called, so an unexpected call fails loudly instead of computing something wrong.

This is test scaffolding for kvroute's real-engine stage, put on PYTHONPATH when the tests
start an engine; it is never installed.
"""

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Writes each request's newly allocated KV slots into its row of the request-to-token map.

    For request i (in batch order), the next `end_offset[i] - start_offset[i]` entries of
    `out_cache_loc` go to `req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]`.
    """
    del pool_len  # the row length; the slices below are bounded by the tensors themselves
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + n].to(req_to_token.dtype)
        taken += n


def _missing(name: str):
    def unavailable(*_args, **_kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available in kvroute's CPU shim "
            "(scripts/real-engines/sgl_kernel_shim): the engine took a path the tests do not use"
        )

    unavailable.__name__ = name
    return unavailable


def __getattr__(name: str):
    """Any other `from sgl_kernel import X` succeeds with a function that raises when called."""
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)
