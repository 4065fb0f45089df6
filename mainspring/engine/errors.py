"""Errors the engine raises for bad input; each message names the problem and what to do."""


class EngineError(Exception):
    """Base class: the request or model given to the engine cannot be served."""


class ModelLoadError(EngineError):
    """The model file or folder is missing, unreadable or corrupt."""


class UnsupportedModelError(EngineError):
    """The model's architecture or a tensor type is not one the engine implements."""


class InvalidRequestError(EngineError, ValueError):
    """A sampling parameter or prompt is invalid (e.g. top_p=2, a prompt longer than the context).

    `param` names the request field at fault when the raiser knows it (the API reports it)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineStepError(EngineError, RuntimeError):
    """The step serving this request raised (a bug, a broken device): the request is lost, and the engine goes on
    with the next ones (engine/async_engine.py). The cause is the step's own exception."""


class EngineStoppedError(EngineError):
    """The engine stopped serving after a failed step it could not recover from; the server must be restarted."""

    MESSAGE = "the engine stopped after a failed step (the server log says why); restart the server"

    def __init__(self, message: str = MESSAGE) -> None:
        super().__init__(message)
