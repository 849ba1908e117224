"""The PTX vocabulary: one small named helper per idiom, grouped by topic, each naming its PTX ISA section."""
