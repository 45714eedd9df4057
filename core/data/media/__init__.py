"""Images, videos and sounds: from a row's file names to the features a model takes.

`columns` names the media columns once. A row's files are resolved and checked (`files`), each
image sized as LLaMA-Factory sizes it (`sizing`), each `<image>`, `<video>` and `<audio>` placeholder
expanded into its family's tokens (`expansion`, with the model folder's processors from
`processor_loading`), all of it over whole rows and saved beside the tokenized data (`rows`), and the
pixels and sounds cut for a batch of ids (`batching`). Videos (`video/`) and sounds (`audio/`) are
decoded and laid out below.
"""
