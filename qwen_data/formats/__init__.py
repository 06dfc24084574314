"""What lies on disk: Megatron's indexed datasets, manifests, atomic outputs, packed rows, SFT layouts, Pai's rows."""
