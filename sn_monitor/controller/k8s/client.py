"""An ApiClient for the Kubernetes drivers and lease (imports the ``kubernetes`` package)."""

from __future__ import annotations

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from sn_monitor.controller.k8s.settings import KubernetesSettings


def api_client(settings: KubernetesSettings) -> k8s.ApiClient:
    """An ApiClient for ``settings``; a bad or missing configuration raises ValueError.

    urllib3's own retries are switched off: the action runner retries, with backoff.
    """
    configuration = k8s.Configuration()
    if settings.host is not None:
        configuration.host = settings.host.rstrip("/")
    else:
        try:
            # The kubernetes.config loaders carry no annotations (hence the ignores).
            if settings.kubeconfig is None and settings.context is None:
                try:
                    k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                        client_configuration=configuration)
                except ConfigException:
                    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                        client_configuration=configuration)
            else:
                k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=settings.kubeconfig, context=settings.context,
                    client_configuration=configuration)
        except (ConfigException, OSError) as err:
            raise ValueError(f"no usable Kubernetes configuration: {err}") from None
    configuration.retries = urllib3.Retry(total=0, read=False, redirect=False)
    return k8s.ApiClient(configuration)
