"""A Spark pipeline on hamq: per-minute totals per product from the topic "orders".

    make run                                      # terminal 1: the broker group
    .venv/bin/python examples/produce_orders.py   # terminal 2: some orders
    .venv/bin/python examples/spark_pipeline.py   # read, aggregate on Spark, write back

It reads every order of "orders" (JSON events from examples/produce_orders.py) into a
DataFrame, groups them by one-minute windows of their event time and by product, writes
one message per (minute, product) to the topic "order-totals" (a JSON body, the
product as its key) and prints the totals. The nameserver comes from HAMQ_NAMESRV
(default make run's two, 127.0.0.1:9876;127.0.0.1:9877), the Spark master from
SPARK_MASTER (default local[2]).
"""

from __future__ import annotations

import os
import sys

import trio
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from hamq.client import AdminClient
from hamq.spark import HamqDataSource

NAMESRV = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877")
ORDER = "order_id string, product string, quantity int, price double, ts long"


async def create_topic(topic: str) -> None:
    async with AdminClient(NAMESRV) as admin:
        await admin.create_topic(topic, 4)


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this venv
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local[2]"))
        .appName("hamq-order-totals")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(HamqDataSource)

    events = (
        spark.read.format("hamq")
        .option("namesrv", NAMESRV)
        .option("topic", "orders")
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("body").cast("string"), ORDER).alias("order"))
        .select("order.*")
        .withColumn("event_time", F.timestamp_millis("ts"))
        .cache()
    )
    orders = events.where(F.col("event_time").isNotNull() & F.col("product").isNotNull())
    skipped = events.count() - orders.count()
    totals = (
        orders.groupBy(F.window("event_time", "1 minute").alias("window"), "product")
        .agg(
            F.count("*").alias("orders"),
            F.sum("quantity").alias("quantity"),
            F.round(F.sum(F.col("quantity") * F.col("price")), 2).alias("revenue"),
        )
        .select(
            F.date_format("window.start", "yyyy-MM-dd HH:mm").alias("minute"),
            "product",
            "orders",
            "quantity",
            "revenue",
        )
        .orderBy("minute", "product")
        .cache()
    )

    trio.run(create_topic, "order-totals")
    (
        totals.select(
            F.to_json(F.struct(*totals.columns)).alias("body"),
            F.col("product").alias("keys"),
        )
        .write.format("hamq")
        .option("namesrv", NAMESRV)
        .option("topic", "order-totals")
        .mode("append")
        .save()
    )

    totals.show(totals.count(), truncate=False)
    summary = totals.agg(F.count("*"), F.sum("orders"), F.sum("quantity")).first()
    assert summary is not None
    rows, order_count, quantity = summary
    print(
        f"wrote {rows} per-minute totals to order-totals: "
        f"{order_count or 0} orders, {quantity or 0} items"
        + (f" ({skipped} messages that are not order events skipped)" if skipped else "")
    )
    spark.stop()


if __name__ == "__main__":
    main()
