#!/usr/bin/env python3
"""Reads an event file with TensorBoard's own readers and prints what they saw as JSON.

The engine's tests run it with the virtual environment's Python (scripts/setup makes .venv from
scripts/requirements-test.txt), so the file is judged by the code TensorBoard itself runs:

  file_version  the first record's Event.file_version (RawEventFileLoader + event_pb2)
  records       how many records RawEventFileLoader yields (it stops, silently, at a bad record)
  record_error  the DataLossError TensorBoard's record reader raises, or null for a clean file
  plugins       per plugin, how many values EventFileLoader (the server's path) migrates to it
  scalars, texts, histograms
                per tag, what EventAccumulator (size_guidance 0: keep everything) holds
"""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.compat import tf
from tensorboard.compat.proto import event_pb2


def record_error(path):
    """Iterates the records with the reader event_file_loader uses; returns its error, if any."""
    with tf.compat.v1.errors.raise_exception_on_not_ok_status() as status:
        reader = tf.pywrap_tensorflow.PyRecordReader_New(tf.compat.as_bytes(path), 0, b"", status)
    while True:
        try:
            reader.GetNext()
        except tf.errors.OutOfRangeError:
            return None
        except tf.errors.DataLossError as error:
            return str(error)


def main(path):
    raw = list(event_file_loader.RawEventFileLoader(path).Load())
    first = event_pb2.Event.FromString(raw[0]) if raw else None

    plugins = {}
    for event in event_file_loader.EventFileLoader(path).Load():
        for value in event.summary.value:
            name = value.metadata.plugin_data.plugin_name
            plugins[name] = plugins.get(name, 0) + 1

    keep_all = {kind: 0 for kind in event_accumulator.DEFAULT_SIZE_GUIDANCE}
    accumulator = event_accumulator.EventAccumulator(path, size_guidance=keep_all, purge_orphaned_data=False)
    accumulator.Reload()
    tags = accumulator.Tags()

    scalars = {
        tag: [{"step": e.step, "wall_time": e.wall_time, "value": e.value} for e in accumulator.Scalars(tag)]
        for tag in tags["scalars"]
    }
    texts = {}
    for tag in tags["tensors"]:
        plugin = accumulator.SummaryMetadata(tag).plugin_data.plugin_name
        texts[tag] = [
            {
                "step": e.step,
                "wall_time": e.wall_time,
                "plugin": plugin,
                "dtype": e.tensor_proto.dtype,
                "rank": len(e.tensor_proto.tensor_shape.dim),
                "text": [s.decode("utf-8") for s in e.tensor_proto.string_val],
            }
            for e in accumulator.Tensors(tag)
        ]
    histograms = {}
    for tag in tags["histograms"]:
        histograms[tag] = []
        for e in accumulator.Histograms(tag):
            h = e.histogram_value
            histograms[tag].append({
                "step": e.step,
                "min": h.min,
                "max": h.max,
                "num": h.num,
                "sum": h.sum,
                "sum_squares": h.sum_squares,
                "bucket_limit": list(h.bucket_limit),
                "bucket": list(h.bucket),
            })

    json.dump({
        "file_version": first.file_version if first else None,
        "records": len(raw),
        "record_error": record_error(path),
        "plugins": plugins,
        "scalars": scalars,
        "texts": texts,
        "histograms": histograms,
    }, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
