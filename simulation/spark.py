"""Starting a SparkSession for the simulation pipeline (sweep, analyze).

PySpark starts Python worker processes with ``PYSPARK_PYTHON``, or ``python3`` from the PATH when
it is unset, which may be an interpreter without pandas, pyarrow or this repository: so the
interpreter running the driver is used for the workers too, and the repository root is put on
their ``PYTHONPATH``. Both must be set before the JVM starts, which is why every session of the
pipeline is built here.

Local masters (``local``, ``local[N]``, ``local[*]``) run everything in this process's JVM. Any other
master URL (``spark://host:7077``, ``yarn``, ``k8s://...``) is a cluster: the executors need
Python with the project's dependencies installed (``pip install connect-coordinator``-like, plus
pandas and pyarrow), and the repository's own packages are shipped to them as a zip
(``SparkContext.addPyFile``) so that an executor runs exactly the driver's code.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MASTER = "local[*]"
# The packages a simulation run imports; shipped to the executors of a cluster.
SHIPPED_PACKAGES = ("simulation", "coordinator", "connect_wire", "worker_client")

_PANDAS_WARNING = r".*PySpark does not yet fully support pandas.*"
_PANDAS_COPY_WARNING = r"The copy keyword is deprecated"


def quiet_pandas_warning() -> None:
    """PySpark 4.x warns (FutureWarning) that pandas >= 3 is not fully supported, and its own
    conversions trip pandas 3's deprecation of ``astype(copy=...)``; the pipeline only moves plain
    numeric, boolean and string columns (and one list of structs) through Arrow, which work.
    Silence those two, nothing else."""
    warnings.filterwarnings("ignore", message=_PANDAS_WARNING, category=FutureWarning)
    warnings.filterwarnings("ignore", message=_PANDAS_COPY_WARNING)


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


def _prepare_environment() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Spark's Python workers inherit the JVM's environment, which inherits ours.
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *paths])


def _code_zip() -> str:
    """A zip of the repository's packages (sources only) for ``addPyFile``."""
    fd, name = tempfile.mkstemp(prefix="connect-sim-code-", suffix=".zip")
    os.close(fd)
    with zipfile.ZipFile(name, "w", zipfile.ZIP_DEFLATED) as z:
        for package in SHIPPED_PACKAGES:
            for path in sorted((ROOT / package).rglob("*.py")):
                z.write(path, path.relative_to(ROOT).as_posix())
    return name


def session(
    master: str = DEFAULT_MASTER,
    app_name: str = "connect-coordinator-simulation",
    shuffle_partitions: int | None = None,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Get or create the SparkSession for ``master`` (see the module doc).

    ``getOrCreate`` semantics: if a session already runs in this process it is returned as is
    (its master is not changed)."""
    quiet_pandas_warning()
    _prepare_environment()
    from pyspark.sql import SparkSession

    local = is_local(master)
    if shuffle_partitions is None:
        shuffle_partitions = 4 if local else 64
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # the sweep prints its own progress
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not local:
        spark.sparkContext.addPyFile(_code_zip())
    return spark
