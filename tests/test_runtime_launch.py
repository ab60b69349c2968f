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
