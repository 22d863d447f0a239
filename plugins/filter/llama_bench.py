"""Filter plugins over module_utils.llama_bench: llama_bench_compare, llama_bench_table."""

from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_bench import compare, table

# Documentation: llama_bench_compare.yml and llama_bench_table.yml beside this file.


def llama_bench_compare(rows):
    return compare([dict(r) for r in rows])


def llama_bench_table(result):
    return table(result)


class FilterModule:
    def filters(self):
        return {"llama_bench_compare": llama_bench_compare, "llama_bench_table": llama_bench_table}
