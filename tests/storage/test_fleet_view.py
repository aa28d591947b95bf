"""The Fleet page's pools: replicas chosen by label, grouped, totalled, the hot one named."""

from __future__ import annotations

from typing import Any

import pytest

from planner.errors import InvalidInput
from storage.dashboards import OverviewRow, fleet, label_keys
from storage.schemas import parse_labels


def _row(name: str, kv: float | None, waiting: float | None, **labels: str) -> OverviewRow:
    blank: dict[str, Any] = dict.fromkeys(
        ("health_message", "model_name", "running", "preemptions_per_s", "itl_p99_s",
         "num_gpu_blocks", "block_size", "last_scrape_at"),
    )  # fmt: skip
    return OverviewRow(name=name, base_url="http://h", health="up", kv_usage=kv,
                       waiting=waiting, ttft_p99_s=kv, labels=labels, **blank)  # fmt: skip


ROWS = [
    _row("a1", 0.5, 0, pool="chat"),
    _row("a2", 0.9, 1, pool="chat"),
    _row("a3", 0.9, 4, pool="chat"),
    _row("b1", None, None, pool="batch"),
    _row("c1", 0.2, 2),
]


def test_pools_by_label_with_totals_and_the_hot_replica() -> None:
    batch, chat, unlabelled = fleet(ROWS, by="pool")
    assert (batch.value, chat.value, unlabelled.value) == ("batch", "chat", None)
    assert chat.hot == "a3"  # as full as a2, with the longer queue
    assert chat.waiting == 5 and chat.kv_usage_max == 0.9
    assert chat.kv_usage_mean == pytest.approx((0.5 + 0.9 + 0.9) / 3)
    assert batch.hot is None and batch.kv_usage_mean is None  # nothing measured yet
    (only,) = fleet(ROWS, {"pool": "chat"})
    assert [r.name for r in only.replicas] == ["a1", "a2", "a3"] and only.label is None
    assert fleet(ROWS, {"pool": "gpu"}) == []
    assert label_keys(ROWS) == ["pool"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pool", "give it as name=value"),
        ("1pool=a", "label name '1pool'"),
        ("__name__=a", "label name '__name__'"),
        ("pool=", "a value of 1-200 characters"),
        (",".join(f"k{i}=v" for i in range(21)), "at most 20 labels"),
    ],
)
def test_bad_labels_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_labels(text)
    assert parse_labels(" pool = chat , region=eu ") == {"pool": "chat", "region": "eu"}
