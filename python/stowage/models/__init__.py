"""Reference models stowage is measured on and demonstrates with (random weights; the shapes are
what matter to memory). ``stowage.models.llama``: a Llama-style decoder with a chunked LM loss."""
