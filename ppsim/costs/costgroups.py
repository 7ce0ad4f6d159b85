"""A cost file's `groups` (what `ppsim costs --json` writes beside `layers`: the distinct
pieces and the layers that share each) are a summary the simulator does not read. A copy
edited there alone would be simulated as if unedited, so groups that disagree with the
entries they summarise are refused."""

from __future__ import annotations

import math
from typing import Any

from ppsim.costs.model import LAYER_FIELDS, LayerCost
from ppsim.errors import UserError


def check_groups(path: str, data: dict[str, Any], layers: tuple[LayerCost, ...],
                 mtp: tuple[LayerCost, ...]) -> None:
    """Refuse groups whose figures differ from `layers` (decoder layers, one entry for all
    or one each) and `mtp` at the indices they name; malformed groups are left alone."""
    groups, total, mtp_n = data.get("groups"), data.get("num_layers"), data.get("mtp_layers", 0)
    if not isinstance(groups, list) or not isinstance(total, int) or not isinstance(mtp_n, int):
        return
    for g, group in enumerate(groups):
        if not isinstance(group, dict) or not isinstance(group.get("layers"), list):
            continue
        for i in group["layers"]:
            entry = _entry(i, total - mtp_n, layers, mtp)
            if entry is None:
                continue
            for key in LAYER_FIELDS:
                said, held = group.get(key), getattr(entry, key)
                if isinstance(said, int | float) and not isinstance(said, bool) and \
                        not math.isclose(said, held, rel_tol=1e-9, abs_tol=1e-12):
                    raise UserError(f"{path}: groups[{g}].{key}",
                                    f"is {said} but layer {i}'s entry holds {held}: groups "
                                    "summarise the entries and are not read",
                                    "edit the entry under layers (or mtp) and delete groups")


def _entry(i: Any, decoder: int, layers: tuple[LayerCost, ...],
           mtp: tuple[LayerCost, ...]) -> LayerCost | None:
    """Layer i's entry (decoder layers, then MTP ones); None for an index the file lacks."""
    if not isinstance(i, int) or isinstance(i, bool) or i < 0:
        return None
    own, at = (layers, i) if i < decoder else (mtp, i - decoder)
    if len(own) == 1:
        return own[0]
    return own[at] if at < len(own) else None
