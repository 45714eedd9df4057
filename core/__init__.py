"""tuneline: fine-tuning stages as a plain library (no Prefect imports here)."""

import logging

# bitsandbytes warns at import on CPUs with AVX512-BF16 that an optional kernel package is absent;
# the fallback it uses is correct, so the warning is noise for every command.
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
