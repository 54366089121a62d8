"""The ``model`` artifact of a run holds the model, not checkpoints or another run's model folder."""

from __future__ import annotations

from pathlib import Path


class RecordingTracker:
    def __init__(self):
        self.logged: list[tuple[str, str]] = []

    def log_artifact(self, path, artifact_path=None):
        self.logged.append((Path(path).name, artifact_path))

    def log_artifacts(self, directory, artifact_path=None):
        for f in sorted(Path(directory).rglob("*")):
            if f.is_file():
                self.logged.append((str(f.relative_to(directory)), artifact_path))


def test_model_artifact_leaves_out_checkpoints_and_the_stage0_folder(tmp_path):
    from suffice.training.fit.finalize import log_model_dir

    out = tmp_path / "model"
    for rel in ("model.safetensors", "suffice_model.json", "adapter/adapter_model.safetensors", "checkpoints/step-10/optimizer.pt",
                "stage0/suffice_model.json", "stage0/model.safetensors", "stage0/checkpoints/step-5/optimizer.pt",
                "evaluation/report.json", "bundle/model.onnx"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("x")
    tracker = RecordingTracker()
    log_model_dir(tracker, out)
    assert sorted(tracker.logged) == [("adapter_model.safetensors", "model/adapter"), ("model.safetensors", "model"),
                                      ("suffice_model.json", "model")]
