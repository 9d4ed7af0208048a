"""The worker client: ``connect-worker``'s runtime (:mod:`worker_client.worker`) and what a plugin
gets from it (:mod:`worker_client.context`). Defined here so that a plugin imports it from the
package: :class:`FencedError`."""

from connect_wire.errors import ProtocolError

__all__ = ["FencedError"]


class FencedError(ProtocolError):
    """A write fenced by the member epoch (``context.commit_offsets``, the task configs) was
    refused: this worker no longer holds the item at a current epoch (``code``:
    STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH or ITEM_NOT_OWNED), so the item
    may be running elsewhere. Nothing was stored. The instance should stop writing; the worker
    stops it."""

    def __repr__(self) -> str:
        return f"FencedError({self.name}, {self.message!r})"
