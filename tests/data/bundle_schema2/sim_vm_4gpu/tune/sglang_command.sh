#!/bin/sh
# pcieprof recommend: SGLang launch for the top-ranked layout
# numbers: simulated, backend sim (fabric model)
# no layout ranked (no model card or no all-reduce measurements)
