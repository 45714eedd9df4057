"""The project's tiny models, built here since nothing can be downloaded: the text model and its
tokenizer (`text`, which the demo pre-trains), and vision-language (`vision`, `minicpm`), audio (`audio`)
and omni (`omni`) models of the families tuneline feeds media to, shaped from transformers' own config
classes and randomly initialised."""
