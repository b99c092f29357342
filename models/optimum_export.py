"""optimum-onnx's export of a saved checkpoint, run by export_matrix.py in optimum's own
transformers (PYTHONPATH = the folder optimum-onnx was installed into with `pip --target`).

    python models/optimum_export.py CHECKPOINT_DIR TASK OUT.onnx
"""

import shutil
import sys
import tempfile
import warnings
from pathlib import Path


def main() -> int:
    checkpoint, task, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    warnings.filterwarnings("ignore")
    from optimum.exporters.onnx import main_export

    with tempfile.TemporaryDirectory(prefix="otfuse-optimum-") as tmp:
        main_export(checkpoint, output=tmp, task=task, device="cpu", library_name="transformers",
                    do_validation=False)  # export_matrix.py runs it in ORT itself
        models = sorted(Path(tmp).glob("*.onnx"))
        if len(models) != 1:
            raise SystemExit(f"optimum wrote {[m.name for m in models]}, expected one model")
        if any(Path(tmp).glob("*.onnx_data")) or any(Path(tmp).glob("*.data")):
            raise SystemExit("optimum wrote external data; the corpus keeps tiny models inline")
        shutil.copyfile(models[0], out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
