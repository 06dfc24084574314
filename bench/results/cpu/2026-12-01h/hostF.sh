#!/usr/bin/env bash
# After a713d8f, part 2 of 3: two thirds of Ray's wheel kept in /tmp.
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostE.sh"; exit 3; }
mkdir -p /tmp/ray && cp .cpuray1/raypart.0* /tmp/ray/ && echo kept
