"""bench.studies.chunk_tradeoff on the bundled model: every C of the grid runs with the bundled defaults (the snap
tolerance carried to each C), and the report carries its command and machine line."""

import csv

import bench.studies.chunk_tradeoff


def test_grid_runs_every_chunk_size_with_the_snap_scaled_to_it(tmp_path, monkeypatch):
    seen = {}
    real = bench.studies.chunk_tradeoff.run_case

    def spy(model, case, method, prefilling):
        seen[prefilling.chunk_size] = prefilling.boundary_snap
        return real(model, case, method, prefilling=prefilling)

    monkeypatch.setattr(bench.studies.chunk_tradeoff, "run_case", spy)
    argv = ["--chunk-sizes", "64", "256", "--top-k", "1", "--lengths", "1024", "--depths", "0.5"]
    argv += ["--tasks", "passkey", "--budget", "60", "--out", str(tmp_path)]
    assert bench.studies.chunk_tradeoff.main(argv) == 0
    # the bundled default is 64 of 256 tokens: a quarter of every chunk (64 would be invalid at C = 64)
    assert seen == {64: 16, 256: 64}
    with open(tmp_path / "chunk_tradeoff.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["chunk_size"]) for r in rows) == [64, 256]
    md = (tmp_path / "chunk_tradeoff.md").read_text()
    assert md.startswith("# Chunk size C x top-K")
    assert "Command: `python -m bench.studies.chunk_tradeoff --chunk-sizes 64" in md
    assert "Machine: CPU" in md and "| 64 | " in md and "| 256 | " in md


def test_a_first_length_too_short_for_the_bundled_k_still_runs_the_grid(tmp_path):
    """The warm-up decodes the grid's own first cell: the bundled K=4 of C=256 does not fit 512 tokens, C=64 K=1
    does."""
    argv = ["--chunk-sizes", "64", "--top-k", "1", "--lengths", "512", "--depths", "0.5", "--tasks", "passkey"]
    assert bench.studies.chunk_tradeoff.main([*argv, "--budget", "60", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "chunk_tradeoff.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["chunk_size"], r["top_k"], r["length"]) for r in rows] == [("64", "1", "512")]
