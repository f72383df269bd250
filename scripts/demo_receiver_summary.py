"""Prints what reached the demo's 'home' receiver: DCGM metrics and their series counts."""

from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9091"
query = urllib.parse.urlencode({"query": 'count by (__name__) ({__name__=~"DCGM_.*"})'})
with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as r:
    result = json.load(r)["data"]["result"]
print(f"{len(result)} DCGM metrics in the receiver, e.g.:")
for item in sorted(result, key=lambda x: x["metric"]["__name__"])[:6]:
    print(f"  {item['metric']['__name__']}: {item['value'][1]} series")
