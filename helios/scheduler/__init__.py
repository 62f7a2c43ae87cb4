"""The pure scheduler core. It imports nothing from engine, server or sim, and reads no clock."""

from helios.scheduler.core import Scheduler
from helios.scheduler.cost import CostState, CostTable
from helios.scheduler.plan import (
    CompletionRecord, ExecutionTiming, Fence, FinishReason, GeneratedToken, Lane, PlanLanes, PlanTrace, RequestHandle,
    ScheduledPlan, SelectionReason,
)
from helios.scheduler.request_spec import ImageSpan, RequestSpec

__all__ = [
    "Scheduler", "CostState", "CostTable", "CompletionRecord", "ExecutionTiming", "Fence",
    "FinishReason", "GeneratedToken", "ImageSpan", "Lane", "PlanLanes", "PlanTrace", "RequestHandle", "RequestSpec",
    "ScheduledPlan", "SelectionReason",
]
