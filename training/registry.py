"""Moved to :mod:`suffice.training.export.registry`; this name re-exports it for one release."""

import sys

from suffice.training.paths import default_artifact_location, default_tracking_uri, mlruns_dir  # noqa: F401
from suffice.training.export.registry import (EXPORT_EXPERIMENT, PYFUNC_EXTRA_REQUIREMENTS, PYFUNC_LOADER_MODULE,  # noqa: F401
                                              REGISTERED_NAMES, SERVING_REQUIREMENTS, RegistryError, download, mlflow_client, find_dir,
                                              main, promote, pyfunc_requirements, pyfunc_signature, register_bundle,
                                              resolve_bundle, resolve_model_dir, save_pyfunc_model)

if __name__ == "__main__":
    sys.exit(main())
