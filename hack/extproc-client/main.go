// extproc-client asks an Endpoint Picker (EPP) for an endpoint the way Envoy's ext_proc filter does: one
// bidirectional envoy.service.ext_proc.v3.ExternalProcessor/Process stream per HTTP request, carrying the
// request headers, then the whole request body (end_of_stream), and reading back the picked endpoint from
// the request-headers response (the x-gateway-destination-endpoint header mutation and the envoy.lb dynamic
// metadata). With -forward it then sends the request to that endpoint over HTTP, as the gateway would, and
// streams the response headers and body back through the EPP so it sees the request complete.
//
// It prints one JSON line and exits 0 when an endpoint was picked, 2 when the EPP answered with an
// immediate response (an error status such as 503 or 429), 1 on any other failure.
//
// hack/epp build compiles it next to the EPP, from the same pinned module graph (go-control-plane, grpc).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const endpointKey = "x-gateway-destination-endpoint"

type result struct {
	Endpoint         string  `json:"endpoint"`          // from the header mutation
	MetadataEndpoint string  `json:"metadata_endpoint"` // from dynamic metadata envoy.lb
	ImmediateStatus  int     `json:"immediate_status"`  // an immediate response's HTTP status, 0 if none
	ImmediateBody    string  `json:"immediate_body"`
	PickSeconds      float64 `json:"pick_seconds"` // from opening the stream to the headers response
	ForwardStatus    int     `json:"forward_status,omitempty"`
	ForwardBody      string  `json:"forward_body,omitempty"`
	Error            string  `json:"error,omitempty"`
}

type headerList []string

func (h *headerList) String() string     { return strings.Join(*h, ",") }
func (h *headerList) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	addr := flag.String("addr", "127.0.0.1:9002", "EPP ext_proc gRPC address (plaintext)")
	model := flag.String("model", "", "model name for the request body")
	path := flag.String("path", "/v1/completions", "request :path")
	prompt := flag.String("prompt", "hello", "prompt for the request body")
	body := flag.String("body", "", "raw request body (overrides -model/-prompt)")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline for the whole exchange")
	forward := flag.Bool("forward", false, "send the request to the picked endpoint over HTTP and report its answer")
	var extra headerList
	flag.Var(&extra, "header", "extra request header key=value (repeatable)")
	flag.Parse()

	res := result{}
	code := run(*addr, *model, *path, *prompt, *body, *timeout, *forward, extra, &res)
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	os.Exit(code)
}

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

func run(addr, model, path, prompt, body string, timeout time.Duration, forward bool, extra headerList, res *result) int {
	start := time.Now()
	fail := func(err error) int { res.Error, res.PickSeconds = err.Error(), time.Since(start).Seconds(); return 1 }
	if body == "" {
		b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
		body = string(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return fail(err)
	}
	headers := []*corev3.HeaderValue{
		hv(":method", "POST"), hv(":path", path), hv(":authority", "gateway.local"), hv(":scheme", "http"),
		hv("content-type", "application/json"), hv("content-length", fmt.Sprint(len(body))),
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		headers = append(headers, hv(strings.ToLower(k), v))
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: headers}},
	}}); err != nil {
		return fail(fmt.Errorf("send headers: %w", err))
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true},
	}}); err != nil {
		return fail(fmt.Errorf("send body: %w", err))
	}

	// The EPP answers the headers only once it has the whole body and has picked (flow control may hold it).
	for res.Endpoint == "" && res.ImmediateStatus == 0 {
		resp, err := stream.Recv()
		if err != nil {
			return fail(fmt.Errorf("recv: %w", err))
		}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			res.ImmediateStatus = int(r.ImmediateResponse.GetStatus().GetCode())
			res.ImmediateBody = string(r.ImmediateResponse.GetBody())
		case *extprocv3.ProcessingResponse_RequestHeaders:
			for _, h := range r.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == endpointKey {
					res.Endpoint = string(h.GetHeader().GetRawValue())
					if res.Endpoint == "" {
						res.Endpoint = h.GetHeader().GetValue()
					}
				}
			}
			if lb := resp.GetDynamicMetadata().GetFields()["envoy.lb"]; lb != nil {
				res.MetadataEndpoint = lb.GetStructValue().GetFields()[endpointKey].GetStringValue()
			}
			if res.Endpoint == "" {
				res.Endpoint = res.MetadataEndpoint
			}
			if res.Endpoint == "" {
				return fail(fmt.Errorf("request-headers response without %s", endpointKey))
			}
		}
	}
	res.PickSeconds = time.Since(start).Seconds()
	if res.ImmediateStatus != 0 {
		_ = stream.CloseSend()
		return 2
	}
	// The body response (the body as the EPP rewrote it) follows; Envoy would send that upstream.
	if forward {
		first := strings.Split(res.Endpoint, ",")[0]
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+first+path, bytes.NewReader([]byte(body)))
		req.Header.Set("content-type", "application/json")
		hr, err := http.DefaultClient.Do(req)
		if err != nil {
			return fail(fmt.Errorf("forward to %s: %w", first, err))
		}
		rb, _ := io.ReadAll(hr.Body)
		hr.Body.Close()
		res.ForwardStatus, res.ForwardBody = hr.StatusCode, string(rb)
		_ = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
			ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				hv(":status", fmt.Sprint(hr.StatusCode)), hv("content-type", hr.Header.Get("content-type")),
			}}},
		}})
		_ = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: rb, EndOfStream: true},
		}})
	}
	_ = stream.CloseSend()
	for { // drain until the EPP ends the stream
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	return 0
}
