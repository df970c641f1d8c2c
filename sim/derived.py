"""`derived`: a value computed from an immutable object on first read and kept in its ``__dict__``
(`functools.cached_property` without its lock).

Python 3.11's `functools.cached_property` takes a lock on every first read (removed in 3.12: the
lock serialised unrelated instances). A sweep makes a plan, a memory report and an estimate's
inputs for each of tens of thousands of configurations and reads a dozen derived values of each
once: 390 ns a first read with the lock, 170 without it (measured on the 2-core VM). simpar
computes these values in one thread, and a value computed twice by two threads is the same
value, so nothing needs the lock. Like `cached_property` it is a non-data descriptor: once
stored, the instance's ``__dict__`` answers and the descriptor is not called again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class derived(Generic[T]):  # noqa: N801 (named as the decorator it is used as)
    __slots__ = ("func", "name", "__doc__")

    def __init__(self, func: Callable[[Any], T]):
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> derived[T]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...
    def __get__(self, instance: object | None, owner: type | None = None) -> T | derived[T]:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.func(instance)
        return value
