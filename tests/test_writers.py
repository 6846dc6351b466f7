"""Result writers: progress.csv follows the metrics that appear, and survives a resume's truncation."""

from __future__ import annotations

import csv

from shoal.logging.writers import CsvWriter, JsonlWriter, truncate_results


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_gains_columns_for_metrics_first_seen_later(tmp_path):
    path = tmp_path / "progress.csv"
    w = CsvWriter(path)
    w.write({"iteration": 1, "episode_return_mean": float("nan"), "nested": {"a": 1}})
    w.write({"iteration": 2, "episode_return_mean": 10.5, "evaluation/episode_return_mean": 20.0})
    w.write({"iteration": 3, "episode_return_mean": 11.0, "league/win_rate/main_1": 0.25})
    w.close()
    lines = path.read_text().splitlines()
    assert lines[0].split(",") == [
        "iteration",
        "episode_return_mean",
        "evaluation/episode_return_mean",
        "league/win_rate/main_1",
    ]
    assert all(len(line.split(",")) == 4 for line in lines)  # earlier rows padded, not ragged
    rows = read_csv(path)
    assert [r["iteration"] for r in rows] == ["1", "2", "3"]
    assert rows[0]["episode_return_mean"] == "" and rows[0]["evaluation/episode_return_mean"] == ""
    assert rows[1]["evaluation/episode_return_mean"] == "20.0" and rows[1]["league/win_rate/main_1"] == ""
    assert rows[2]["evaluation/episode_return_mean"] == "" and rows[2]["league/win_rate/main_1"] == "0.25"


def test_csv_resume_after_truncation_keeps_and_extends_columns(tmp_path):
    path = tmp_path / "progress.csv"
    w = CsvWriter(path)
    for i in range(1, 4):
        w.write({"iteration": i, "loss": 0.5, **({"evaluation/x": 1.0 * i} if i == 2 else {})})
    w.close()
    truncate_results(tmp_path, 2)  # resuming from the checkpoint of iteration 2
    assert [r["iteration"] for r in read_csv(path)] == ["1", "2"]
    w = CsvWriter(path)  # the resumed run appends under the existing header
    w.write({"iteration": 3, "loss": 0.25})
    w.write({"iteration": 4, "loss": 0.125, "new/metric": 7})
    w.close()
    rows = read_csv(path)
    assert list(rows[0]) == ["iteration", "loss", "evaluation/x", "new/metric"]
    assert [(r["iteration"], r["loss"], r["evaluation/x"], r["new/metric"]) for r in rows] == [
        ("1", "0.5", "", ""),
        ("2", "0.5", "2.0", ""),
        ("3", "0.25", "", ""),
        ("4", "0.125", "", "7"),
    ]


def test_a_deleted_progress_csv_is_started_anew_with_its_header(tmp_path, caplog):
    """results.jsonl and progress.csv deleted mid-run: both come back at the next row, each with a
    warning; progress.csv with its header, and still gaining columns for new metrics."""
    jsonl, path = JsonlWriter(tmp_path / "results.jsonl"), tmp_path / "progress.csv"
    w = CsvWriter(path)
    for writer in (jsonl, w):
        writer.write({"iteration": 1, "loss": 0.5})
    (tmp_path / "results.jsonl").unlink()
    path.unlink()
    with caplog.at_level("WARNING", logger="shoal.writers"):
        for writer in (jsonl, w):
            writer.write({"iteration": 2, "loss": 0.25})
            writer.write({"iteration": 3, "loss": 0.125, "evaluation/x": 1.0})
    jsonl.close()
    w.close()
    assert path.read_text().splitlines()[0] == "iteration,loss,evaluation/x"
    assert [(r["iteration"], r["loss"], r["evaluation/x"]) for r in read_csv(path)] == [
        ("2", "0.25", ""),
        ("3", "0.125", "1.0"),
    ]
    warned = [r.getMessage() for r in caplog.records if "deleted or replaced" in r.getMessage()]
    assert len(warned) == 2 and any("progress.csv" in m for m in warned), warned
