"""Exceptions that raise as soon as something reads them: the runtime, a library's callbacks or a
log handler. The containment tests have a model raise them, so whatever reads a model's failure
is proven to read it where nothing escapes."""

from __future__ import annotations

from typing import Any

# Read as attributes (a property that raises) or called as methods, by whoever formats, logs or
# classifies an exception.
READ_AS_PROPERTY = ("code", "status_code", "__class__", "__notes__", "__cause__", "args")
READ_AS_METHOD = ("__str__", "__repr__")


def hostile_exception(
    base: type[BaseException], where: str, raises: type[BaseException], secret: str
) -> BaseException:
    """An instance of a subclass of ``base`` that raises ``raises`` (its text holding
    ``secret``) as anything reads ``where``."""

    def boom(*_: Any) -> Any:
        raise raises(f"{where}: {secret}")

    if where in READ_AS_METHOD:
        namespace: dict[str, Any] = {where: boom}
    else:
        namespace = {where: property(boom, lambda self, value: None)}
    hostile: BaseException = type(f"Hostile{base.__name__}", (base,), namespace)()
    return hostile
