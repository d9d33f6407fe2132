# frozen_string_literal: true

module Herald
  class Web
    # CSRF protection without a session: a double-submit cookie. Every page sets a random token in an
    # HttpOnly, SameSite=Strict cookie and puts the same token in its forms; a POST must carry both, equal.
    # With a secret (Herald::Web.secret) the cookie is signed too, so a cookie planted from a sibling
    # subdomain does not pass. A POST whose Origin names another host is refused as well.
    class Csrf
      COOKIE = "herald_web_csrf"
      FIELD = "csrf"

      def initialize(req, secret:)
        @req = req
        @secret = secret
        @given = req.cookies[COOKIE]
        @token = (@given if @given && signed?(@given)) || issue
      end

      attr_reader :token

      def valid?
        return false unless @given && signed?(@given) && same_origin?
        sent = @req[FIELD].to_s
        sent.bytesize == @given.bytesize && OpenSSL.fixed_length_secure_compare(sent, @given)
      end

      # Adds the cookie to a response when the browser does not have this token yet.
      def set_cookie(response)
        return response if @given == @token
        path = @req.script_name.empty? ? "/" : @req.script_name
        response[1]["set-cookie"] = "#{COOKIE}=#{@token}; path=#{path}; HttpOnly; SameSite=Strict"
        response
      end

      private

      def issue
        nonce = SecureRandom.hex(16)
        @secret ? "#{nonce}.#{sign(nonce)}" : nonce
      end

      def signed?(value)
        return value.match?(/\A\h{32}\z/) unless @secret
        nonce, signature = value.split(".", 2)
        return false unless nonce&.match?(/\A\h{32}\z/) && signature
        expected = sign(nonce)
        signature.bytesize == expected.bytesize && OpenSSL.fixed_length_secure_compare(signature, expected)
      end

      def sign(nonce) = OpenSSL::HMAC.hexdigest("SHA256", @secret.to_s, nonce)

      def same_origin?
        origin = @req.header("Origin")
        return true if origin.nil? || origin.empty?
        URI(origin).host == @req.env["HTTP_HOST"].to_s.sub(/:\d+\z/, "").delete_prefix("[").delete_suffix("]")
      rescue URI::InvalidURIError
        false
      end
    end
  end
end
