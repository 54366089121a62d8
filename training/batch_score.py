"""Moved to :mod:`suffice.serving.batch` (it needs only serving); this name re-exports it for one release."""

import sys

from suffice.serving.batch import (BatchScoreError, JsonlRowWriter, ParquetRowWriter, ScoreSummary, count_rows, file_format, iter_jsonl_chunks,  # noqa: F401
                                   iter_parquet_chunks, main, parse_keep_columns, build_parser, score_file)

if __name__ == "__main__":
    sys.exit(main())
