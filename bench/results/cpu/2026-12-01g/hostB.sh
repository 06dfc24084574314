#!/usr/bin/env bash
# Round 1, part 2 of 3: two thirds of Ray's wheel kept in /tmp.
mkdir -p /tmp/ray && cp .cpuray1/raypart.0* /tmp/ray/ && ls -la /tmp/ray; python3 -c "import gigatoken" && echo "same machine"
