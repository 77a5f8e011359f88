"""The MQTT bridge (`whisperq mqtt`, the Procfile's optional `mqtt` line; docs/clients/mqtt.md).

It subscribes to the request topic (QoS 1, a persistent session under a fixed client id, so
requests sent while it is away wait for it at the broker) and submits each request through
the API's own code (web.uploads, web.admission: the same checks, job row and publish). A
request is acknowledged to the broker only once its job exists and the replies it is owed are
recorded (models.delivery.mqtt_replies), or once its error reply is out; then the bridge
publishes the job's status changes and its result to the client's reply topic, QoS 1.

Modules: ``requests`` (reading a request: who sent it, where replies go, what it asks),
``submit`` (who owns its job, and submitting it), ``replies`` (what the clients are owed,
published until the broker has acknowledged it), ``bridge`` (the connection and the threads).
"""
