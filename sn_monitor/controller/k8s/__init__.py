"""The Kubernetes API, for the drivers and the lease that use it.

``settings`` is plain data (it imports no Kubernetes client): the controller's config and
job files name API access with it on any install. ``client`` builds an ApiClient and is
imported only by the drivers and the lease (``pip install 'sn-monitor[kubernetes]'``).
"""
