"""Which documented answers a schemathesis run saw, per operation.

Usage: python3 .ci/openapi-answers.py DOCUMENT EVENTS.ndjson

Reads the document (YAML; PyYAML comes with schemathesis) and the run's
NDJSON events, and prints, per operation, the statuses it received and the
documented ones it never provoked (a healthy one-node cluster without
credentials cannot answer 401, 403, 408, 429, 500 or 503). Exits 1 if an
operation answered a status the document does not list: schemathesis fails
the run on that too; this names them all at once.
"""

import collections
import json
import sys

import yaml


def main(document, events):
    doc = yaml.safe_load(open(document))
    documented = {}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method != "parameters":
                documented[f"{method.upper()} {path}"] = {int(s) for s in op["responses"]}
    seen = collections.defaultdict(collections.Counter)
    for line in open(events):
        finished = json.loads(line).get("ScenarioFinished")
        if not finished:
            continue
        label = finished["recorder"]["label"]
        for interaction in (finished["recorder"].get("interactions") or {}).values():
            request, response = interaction["request"], interaction.get("response")
            if response is None:
                continue
            # Stateful scenarios carry several operations; name each by its own request.
            op = next((o for o in documented if matches(o, request)), label)
            seen[op][response["status_code"]] += 1
    undocumented = 0
    print(f"{'operation':42} {'answers seen (count)':44} documented, not provoked")
    for op, statuses in sorted(documented.items()):
        got = seen.get(op, collections.Counter())
        shown = " ".join(f"{s}({n})" for s, n in sorted(got.items()))
        missing = " ".join(str(s) for s in sorted(statuses - set(got)))
        print(f"{op:42} {shown or '-':44} {missing}")
        extra = {s for s in got if s not in statuses and s != 405}
        if extra:
            print(f"  UNDOCUMENTED: {sorted(extra)}")
            undocumented += 1
    print(f"{sum(sum(c.values()) for c in seen.values())} answers to {len(seen)} operations")
    return 1 if undocumented else 0


def matches(op, request):
    """Whether `request` (method, uri) is an instance of `op` ("GET /v1/locks/{key}")."""
    method, template = op.split(" ", 1)
    if request["method"] != method:
        return False
    path = "/" + request["uri"].split("://", 1)[1].split("/", 1)[1].split("?")[0]
    want, got = template.strip("/").split("/"), path.strip("/").split("/")
    if len(want) != len(got):
        return False
    return all(w.startswith("{") or w == g for w, g in zip(want, got))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
