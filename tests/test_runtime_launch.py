"""CPU tests of the runtime's launch arguments (no GPU: nothing here reaches the driver's launch)."""

from __future__ import annotations

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
