"""A correct solution of exercise 01 (lessons/exercises/skeletons/ex01_promotion.py): CI grades it with the installed
wheel (.ci/run), the cheapest exercise to grade on a CPU."""


def promote(total, partial, sa_value, sb_value):
    return total + partial * (sa_value * sb_value)
