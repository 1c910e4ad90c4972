from tests.engine.conftest import one_torch_thread, tiny

__all__ = ["one_torch_thread", "tiny"]
