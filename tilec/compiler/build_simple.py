"""The builder of standalone pools: every window (overlapping, strided, padded, or window == stride) goes through the
window-pool rule (rules_pool.py); element-wise nests and transposes are scheduled by rules.py."""
from __future__ import annotations

from tilec.compiler.build_conv import Fresh
from tilec.compiler.expr_instrs import ExprCompiler  # noqa: F401  (build_rowchain imports it from here)
from tilec.compiler.ir import Buf, Stmt
from tilec.compiler.ops import PoolOp
from tilec.compiler.rules_pool import build_window_pool
from tilec.compiler.schedule import PoolPlan

Built = tuple[list[tuple[str, int]], list[Stmt]]


def build_pool(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    return build_window_pool(op.windowed(), plan, hbm, fresh)
