# llmgate: a static binary on an empty image, run as a non-root user.
#   docker build -t llmgate .
#   docker run --rm -p 8080:8080 -e LLMGATE_LISTEN=0.0.0.0:8080 llmgate serve --config /etc/llmgate/llmgate.yaml
# See docs/deploy.md (and deploy/compose.yaml for Redis with 3 replicas).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/llmgate ./cmd/llmgate \
 && mkdir -p /out/state && chown 65532:65532 /out/state

FROM scratch
# Provider APIs are HTTPS; time zones ship inside the binary (time/tzdata).
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/
COPY --from=build /out/llmgate /llmgate
# The memory store's budgets and tenants (unused with a Redis store).
COPY --from=build --chown=65532:65532 /out/state /var/lib/llmgate
ENV LLMGATE_STATE_DIR=/var/lib/llmgate
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/llmgate"]
CMD ["serve"]
