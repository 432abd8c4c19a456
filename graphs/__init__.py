"""Prebuilt LangGraph graphs, one per way of managing context (an "arm"), with one interface."""

from keeper_middleware.graphs.arms import ARMS, Arm, ArmInfo, build_arm

__all__ = ["ARMS", "Arm", "ArmInfo", "build_arm"]
