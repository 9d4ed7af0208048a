"""Client-side assignors: the interface (:mod:`.api`) and Kafka Connect's two assignors,
:class:`EagerAssignor` and :class:`IncrementalCooperativeAssignor` (``docs/assignors.md``)."""

from .api import (
    Assignor,
    AssignorMetadata,
    GroupAssignment,
    GroupSpec,
    MemberAssignmentInfo,
    MemberSpec,
    MemberTarget,
    group_from_prepare,
    install_request,
)
from .eager import EagerAssignor
from .incremental import DEFAULT_MAX_DELAY_MS, IncrementalCooperativeAssignor

__all__ = [
    "DEFAULT_MAX_DELAY_MS",
    "Assignor",
    "AssignorMetadata",
    "EagerAssignor",
    "GroupAssignment",
    "GroupSpec",
    "IncrementalCooperativeAssignor",
    "MemberAssignmentInfo",
    "MemberSpec",
    "MemberTarget",
    "group_from_prepare",
    "install_request",
]
