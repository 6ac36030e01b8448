"""Reads the offline wandb runs under a WANDB_DIR with wandb's own reader of `.wandb` files
(`wandb.sdk.internal.datastore`, the LevelDB-log framing with its CRC checks, and the
`wandb.proto` Record messages), and the tables they reference from the run's files; prints
what they hold as JSON for tests/wandb_sync.rs to compare with the smallrl run directory.

Each run: its run record (id, display name, project, group, config), every history record as
{"_step": n, key: value} (values parsed from wandb's JSON; a table is replaced by
{"columns", "data"} read from the file its history entry names).

usage: read_wandb_offline.py WANDB_DIR
"""

import glob
import json
import os
import sys

from wandb.proto import wandb_internal_pb2
from wandb.sdk.internal import datastore


def records(path):
    store = datastore.DataStore()
    store.open_for_scan(path)
    while True:
        data = store.scan_data()
        if data is None:
            return
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        yield record


def item_key(item):
    """(top-level key, path below it) of a history item: `key`, or `nested_key`."""
    if item.key:
        return item.key, []
    return item.nested_key[0], list(item.nested_key[1:])


def read_run(path):
    files = os.path.join(os.path.dirname(path), "files")
    run = {"file": path, "history": []}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.update(run_id=r.run_id, name=r.display_name, project=r.project, entity=r.entity, group=r.run_group)
            run["config"] = {u.key: json.loads(u.value_json) for u in r.config.update if u.key != "_wandb"}
        elif kind == "history":
            row = {}
            for item in record.history.item:
                key, below = item_key(item)
                value = json.loads(item.value_json)
                if below:
                    node = row.setdefault(key, {})
                    for part in below[:-1]:
                        node = node.setdefault(part, {})
                    node[below[-1]] = value
                else:
                    row[key] = value
            for key, value in row.items():
                if isinstance(value, dict) and value.get("_type") == "table-file":
                    with open(os.path.join(files, value["path"]), encoding="utf-8") as f:
                        table = json.load(f)
                    row[key] = {"columns": table["columns"], "data": table["data"]}
            run["history"].append(row)
    return run


def main():
    wandb_dir = sys.argv[1]
    paths = sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb")))
    json.dump({"runs": [read_run(path) for path in paths]}, sys.stdout)


if __name__ == "__main__":
    main()
