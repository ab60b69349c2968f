"""The RL tests run tiny models: intra-op threads only add overhead on a loaded 2-core machine."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
