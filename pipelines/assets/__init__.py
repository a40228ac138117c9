"""Assets by stage: ingest (corpus, tokenizer, labels), embeddings, recurrent, transformer."""
