"""The Azure 2023 CSV loader builds a sorted trace's workload columns directly (no RequestSpec per
row): the same workload as the specs give, field for field."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.traces.errors import InputError
from servesim.traces.external import load_azure


def _csv(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(r + "\n" for r in rows))
    return path


def test_the_columns_are_the_specs_workload(tmp_path):
    path = _csv(tmp_path, ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:46.6805900,396,109",
                           "2023-11-16 18:15:50.9951690,879,29", "2023-11-17 01:02:03.0000001,1,1"])
    cols, specs = load_azure(path), load_azure(path, require_sorted=False)
    assert list(cols.requests) == list(specs.requests)
    assert (cols.name, cols.source, cols.attribution) == (specs.name, specs.source, specs.attribution)
    first = cols.requests[0]
    assert (first.request_id, first.arrival_time_s, first.prompt_len, first.output_len) == ("azure-0", 0.0, 374, 44)
    assert cols.requests[2].arrival_time_s == (4.3145790)  # (50.9951690 - 46.6805900) s, from integer ns
    assert not cols.columns.any_set("prefix_hash_ids") and len(cols) == 4


@pytest.mark.parametrize("row,field", [("2023-11-16 18:15:46.6,0,44", "ContextTokens"),
                                       ("2023-11-16 18:15:46.6,3,0", "GeneratedTokens"),
                                       ("2023-11-16 18:15:46.6,3.5,1", "ContextTokens")])
def test_bad_lengths_are_refused_before_any_column(tmp_path, row, field):
    with pytest.raises(InputError) as err:
        load_azure(_csv(tmp_path, ["2023-11-16 18:15:40.0,5,5", row]))
    assert err.value.field == field and err.value.line == 3
