"""The "hamq" PySpark data source: read topics into DataFrames, write DataFrames to topics.

    from pyspark.sql import SparkSession
    from hamq.spark import HamqDataSource

    spark = SparkSession.builder.getOrCreate()
    spark.dataSource.register(HamqDataSource)
    df = spark.read.format("hamq").option("topic", "orders").load()
    df.selectExpr("body").write.format("hamq").option("topic", "copy").mode("append").save()

Needs the ``spark`` extra (``pip install 'hamq[spark]'``: PySpark 4.2+, PyArrow, numpy).

- datasource.py  HamqDataSource and its readers and writers (Spark's side)
- options.py     the options, parsed and checked; offsets as JSON
- planning.py    which offsets a read covers (the driver's side)
- reading.py     a queue range pulled into Arrow batches (an executor's side)
- writing.py     rows sent with the producer (an executor's side)
- columns.py     records decoded column-wise into Arrow batches
- bridge.py      Trio work consumed from Spark's plain threads
"""

try:
    import numpy  # noqa: F401
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"hamq.spark needs PySpark, PyArrow and numpy: pip install 'hamq[spark]' ({exc})"
    ) from exc

from hamq.spark.datasource import HamqDataSource
from hamq.spark.planning import DataLossError

__all__ = ["DataLossError", "HamqDataSource"]
