"""Raw PTX from Python: a vocabulary of named idioms, PTX -> cubin (nvJitLink), SASS listing, launch."""
