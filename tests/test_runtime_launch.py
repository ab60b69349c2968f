"""CPU tests of the runtime's launch arguments (no GPU: nothing here reaches the driver's launch) and of its graph
capture helper."""

from __future__ import annotations

import contextlib
import gc

import pytest

from trace_kernels.runtime.kernel import CudaKernel, pdl_launch_config


def test_pdl_launch_config_carries_the_programmatic_serialization_attribute():
    from cuda.bindings import driver as cu
    config = pdl_launch_config(cu, (7, 3, 1), (256, 1, 1), 4096, 0x1234)
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (7, 3, 1)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ) == (256, 1, 1)
    assert config.sharedMemBytes == 4096
    assert int(config.hStream) == 0x1234
    assert config.numAttrs == 1
    attribute = config.attrs[0]
    assert attribute.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attribute.value.programmaticStreamSerializationAllowed == 1


def test_a_cooperative_launch_cannot_be_programmatic():
    kernel = CudaKernel("some_kernel", b"not a cubin")
    with pytest.raises(ValueError, match="some_kernel: a cooperative launch cannot"):
        kernel.launch(0, (1,), (32,), [], cooperative=True, pdl=True)


def _fake_graph(seen: list):
    """Stands in for torch.cuda.graph: records whether the cyclic GC is on while the capture is open."""
    @contextlib.contextmanager
    def graph(g, **kwargs):
        seen.append(("enter", gc.isenabled(), kwargs))
        yield
        seen.append(("exit", gc.isenabled()))
    return graph


@pytest.mark.parametrize("enabled_before", [True, False])
def test_capture_graph_pauses_the_cyclic_gc(monkeypatch, enabled_before):
    """The collector is off for the whole capture and afterwards as it was, also when the capture raises."""
    from trace_kernels.runtime import graphs
    seen = []
    monkeypatch.setattr(graphs.torch.cuda, "graph", _fake_graph(seen))
    was = gc.isenabled()
    try:
        (gc.enable if enabled_before else gc.disable)()
        with graphs.capture_graph("g", pool="p"):
            seen.append(("body", gc.isenabled()))
        assert seen == [("enter", False, {"pool": "p"}), ("body", False), ("exit", False)]
        assert gc.isenabled() == enabled_before
        with pytest.raises(RuntimeError, match="boom"):
            with graphs.capture_graph("g"):
                raise RuntimeError("boom")
        assert gc.isenabled() == enabled_before
    finally:
        (gc.enable if was else gc.disable)()


def test_occupancy_is_asked_once_per_shape_and_again_after_a_shared_memory_limit(monkeypatch):
    """max_active_blocks_per_sm memoizes the driver's answer per (device, threads, smem); raising the dynamic
    shared-memory limit forgets that device's answers."""
    from trace_kernels.runtime import kernel as kernel_module

    calls, raised = [], []

    class FakeDriver:
        class CUfunction_attribute:
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

        def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, fn, threads, smem):
            calls.append((threads, smem))
            return 0, 4 if smem == 0 else 1

        def cuFuncSetAttribute(self, fn, attr, value):
            raised.append(value)
            return (0,)

    monkeypatch.setattr(kernel_module, "driver", FakeDriver)
    monkeypatch.setattr(kernel_module, "check", lambda result, *names: result[1] if len(result) > 1 else None)
    kernel = CudaKernel("some_kernel", b"not a cubin")
    monkeypatch.setattr(kernel, "function", lambda device_index: object())
    assert [kernel.max_active_blocks_per_sm(0, 256) for _ in range(3)] == [4, 4, 4]
    assert kernel.max_active_blocks_per_sm(0, 256, 100_000) == 1
    assert calls == [(256, 0), (256, 100_000)]
    kernel.allow_dynamic_smem(0, 100_000)
    assert kernel.max_active_blocks_per_sm(0, 256) == 4
    assert calls[-1] == (256, 0) and len(calls) == 3
    # below 48 KB too: the default limit is 48 KB minus the kernel's static shared memory (48 KB of dynamic next to
    # 4 KB of static tables fitted no CTA); not again below a limit already set on that device, never for none
    kernel.allow_dynamic_smem(0, 49_152)
    kernel.allow_dynamic_smem(0, 40_000)
    kernel.allow_dynamic_smem(0, 0)
    kernel.allow_dynamic_smem(1, 40_000)
    assert raised == [100_000, 40_000]


def test_refit_kernel_arguments_follow_the_template(monkeypatch):
    """ops.refit_weights' one argument list: pointers, E, N*K, K, the two plan integers, the status word."""
    import importlib

    import torch

    refit_ops = importlib.import_module("trace_kernels.ops.refit_weights")  # the package exports the op's function
    status = torch.zeros(2, dtype=torch.int32)
    monkeypatch.setattr(refit_ops, "status_buffer", lambda device: status)
    w = torch.zeros(3, 8, 32)
    out = [torch.zeros(1) for _ in range(4)]
    args = refit_ops._kernel_args(0, w, *out, 5, 1)
    values = [value for _, value in args]
    assert values == [w.data_ptr(), *(t.data_ptr() for t in out), 3, 8 * 32, 32, 5, 1, status.data_ptr()]


def test_an_installed_kernel_is_what_kernel_for_returns(monkeypatch):
    """The profiling scripts' instrumented builds replace a spec's kernel in the process without touching the cache."""
    from trace_kernels import runtime
    from trace_kernels.codegen.ops import decode_attention as codegen
    spec = codegen.combine_spec(64)
    monkeypatch.setattr(runtime, "_kernels", {})
    monkeypatch.setattr("trace_kernels.jit.cubin_for", lambda s: pytest.fail(f"built {s.name} from the cache"))
    build = CudaKernel(spec.name, b"an instrumented cubin")
    runtime.install_kernel(build)
    assert runtime.kernel_for(spec) is build
    other = CudaKernel(spec.name, b"another build")
    runtime.install_kernel(other)
    assert runtime.kernel_for(spec) is other
