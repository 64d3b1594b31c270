"""OpenAPI documents of the kinds Kube32 serves: ``/openapi/v2`` and ``/openapi/v3``.

The schemas of Kubernetes' own kinds are vendored, not written here: definitions.json.gz
holds kube-apiserver v1.32's definitions of exactly the kinds in
kube32.apiserver.resources (with their lists, their subresources' kinds and what they
refer to), made by tools/vendor_openapi.py from the ``kubernetes-validate`` wheel.  The
Checkpoint's schema is Kube32's own (kube32.apiserver.schema).  :mod:`.documents`
builds the documents from both; :mod:`.proto` encodes the v2 document in the protobuf
form (gnostic's ``openapi.v2.Document``) clients ask for with
``application/com.github.proto-openapi.spec.v2@v1.0+protobuf``.
"""
