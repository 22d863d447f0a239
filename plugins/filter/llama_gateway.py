"""Filter plugins: llamafleet.mtp.llama_gateway_servers, llamafleet.mtp.llama_gateway_server_name
(thin wrappers over module_utils/gateway.py)."""

from __future__ import annotations

# Documentation: llama_gateway_servers.yml and llama_gateway_server_name.yml beside this file.
from ansible.errors import AnsibleFilterError
from ansible_collections.llamafleet.mtp.plugins.module_utils.gateway import GatewayError, server_name, servers


def llama_gateway_servers(
    published, backend_hosts, gateway_host, instance_names=None, host_states=None, unreachable=None
):
    try:
        return servers(
            dict(published),
            list(backend_hosts),
            gateway_host,
            list(instance_names or []),
            dict(host_states or {}),
            list(unreachable or []),
        )
    except GatewayError as e:
        raise AnsibleFilterError(str(e)) from None


def llama_gateway_server_name(instance, host):
    return server_name(host, instance)


class FilterModule:
    def filters(self):
        return {"llama_gateway_servers": llama_gateway_servers, "llama_gateway_server_name": llama_gateway_server_name}
