# frozen_string_literal: true

module Herald
  class Web
    # What the dashboard reads from a Rack env, without needing the rack gem: path, query and form
    # parameters (as UTF-8, invalid bytes replaced), cookies.
    class Request
      MAX_FORM = 1024 * 1024

      attr_reader :env

      def initialize(env)
        @env = env
      end

      def request_method = @env["REQUEST_METHOD"]

      def get? = request_method == "GET" || request_method == "HEAD"

      def post? = request_method == "POST"

      def path = @env["PATH_INFO"].to_s.chomp("/")

      def script_name = @env["SCRIPT_NAME"].to_s

      def params = @params ||= query.merge(form)

      def [](key) = params[key]

      # Every value given under `key` ("ids" from several check boxes, ids=1&ids=2).
      def all(key) = (query_pairs + form_pairs).filter_map { |k, v| v if k == key }

      def cookies
        @cookies ||= @env["HTTP_COOKIE"].to_s.split(/;\s*/).each_with_object({}) do |pair, jar|
          name, value = pair.split("=", 2)
          jar[name] ||= URI.decode_www_form_component(value.to_s) if name
        rescue ArgumentError
          next
        end
      end

      def header(name) = @env["HTTP_#{name.upcase.tr("-", "_")}"]

      private

      def query = query_pairs.to_h

      def form = form_pairs.to_h

      def query_pairs = @query_pairs ||= decode(@env["QUERY_STRING"].to_s)

      def form_pairs
        @form_pairs ||= if post? && !@env["CONTENT_TYPE"].to_s.include?("multipart")
          decode(@env["rack.input"]&.read(MAX_FORM).to_s)
        else
          []
        end
      end

      # Percent-escaped (browsers) or raw UTF-8 (`curl -d`); a bad escape drops that pair, not the form.
      def decode(text)
        text.b.split(/[&;]/).filter_map do |pair|
          key, value = pair.split("=", 2).map { |part| URI.decode_www_form_component(part.to_s).force_encoding(Encoding::UTF_8).scrub }
          [key, value.to_s] unless key.nil? || key.empty?
        rescue ArgumentError
          nil
        end
      end
    end
  end
end
